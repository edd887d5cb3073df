"""Builds torchtpu._C with CMake + Ninja (see CMakeLists.txt)."""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        # An editable install (`make setup`) builds into the developer's tree: build/py and
        # python/torchtpu/_C*.so. A wheel (`pip install .`) builds apart, in build/wheel, so
        # it never reconfigures the developer's build with the isolated build env's torch.
        editable = getattr(self, "editable_mode", False)
        default_dir = ROOT / "build" / ("py" if editable else "wheel")
        build_dir = Path(os.environ.get("TORCHTPU_BUILD_DIR", default_dir))
        module_dir = ROOT / "python" / "torchtpu" if editable else build_dir / "module"
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DTORCHTPU_MODULE_DIR={module_dir}",
            f"-DTORCHTPU_WHEEL={'OFF' if editable else 'ON'}",
            # The GoogleTest suite is for developers (`make` turns it on); a plain
            # `pip install .` needs no GoogleTest.
            "-DTORCHTPU_BUILD_TESTS=" + os.environ.get("TORCHTPU_BUILD_TESTS", "OFF"),
        ]
        subprocess.check_call(cfg)
        build = ["cmake", "--build", str(build_dir)]
        # TORCHTPU_JOBS, else CMake's own CMAKE_BUILD_PARALLEL_LEVEL, else every core.
        jobs = os.environ.get("TORCHTPU_JOBS")
        if jobs is None and "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
            jobs = str(os.cpu_count() or 2)
        subprocess.check_call(build + (["-j", jobs] if jobs else []))
        built = next(module_dir.glob("_C*.so"))
        dest = Path(self.get_ext_fullpath(ext.name))
        if dest.resolve() != built.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(built), str(dest))


setup(ext_modules=[Extension("torchtpu._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
