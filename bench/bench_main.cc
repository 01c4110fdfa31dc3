#include <benchmark/benchmark.h>

#include "gradscope/methods/cpu_executor.h"

int main(int argc, char** argv) {
  benchmark::AddCustomContext("cpu_kernels", std::string(gradscope::methods::cpuKernelIsa()));
  benchmark::AddCustomContext("threads", std::to_string(gradscope::methods::CpuExecutor::shared().threads()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
