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
        build_dir = Path(os.environ.get("TORCHTPU_BUILD_DIR", ROOT / "build" / "py"))
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DPython3_EXECUTABLE={sys.executable}",
            # The GoogleTest suite is for developers (`make` turns it on); a plain
            # `pip install .` needs no GoogleTest.
            "-DTORCHTPU_BUILD_TESTS=" + os.environ.get("TORCHTPU_BUILD_TESTS", "OFF"),
        ]
        subprocess.check_call(cfg)
        jobs = os.environ.get("TORCHTPU_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs])
        # The module is written into python/torchtpu; copy it where setuptools expects it
        # for non-editable installs.
        built = next((ROOT / "python" / "torchtpu").glob("_C*.so"))
        dest = Path(self.get_ext_fullpath(ext.name))
        if dest.resolve() != built.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(built), str(dest))


setup(ext_modules=[Extension("torchtpu._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
