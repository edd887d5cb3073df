// Async compiles: first builds compile on a pool of threads while the host
// records on, and launches queue behind them in order, returning placeholder
// buffers (pjrt::Buffer::placeholder) that a single runner thread fills. The
// queue keeps PJRT's order of executions the host's order, so donation and
// replacement of buffers behave as if every launch ran at once.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aten/launch.h"

namespace torchtpu::aten::async_runs {

// Whether first builds compile on the pool (TORCHTPU_ASYNC_COMPILE, default on).
bool enabled();
// Threads compiling first builds: TORCHTPU_COMPILE_THREADS, default the cores.
int compile_threads();
// Runs `task` on the compile pool; it sets its entry's state, and the pool
// then wakes wait_compiled.
void submit_compile(std::function<void()> task);
// Blocks until `e` is not Compiling.
void wait_compiled(const Launchable& e);

// Runs a launch's program on `device`: the launcher's direct path.
using RunFn = std::vector<pjrt::BufferPtr> (*)(const Launchable& e,
                                               const std::vector<pjrt::BufferPtr>& args,
                                               int device);
// Queues a run after those queued before and returns its outputs as
// placeholders. A failed compile or run fails them with its message (naming
// the program by `e->what`).
std::vector<pjrt::BufferPtr> enqueue(std::shared_ptr<const Launchable> e,
                                     std::vector<pjrt::BufferPtr> args, int device, RunFn run);
// Whether runs are queued or running (a launch must then queue too).
bool busy();
// Blocks until every queued run was handed to PJRT and no compile is in
// progress (metrics, synchronize, collectives, Debug Eager).
void wait_idle();
// Tests: while held, the pool starts no compile (the host can be seen going on).
void hold(bool on);

}  // namespace torchtpu::aten::async_runs
