# Sourced by the GPU profile scripts: ncu_detail NCU LOG REGEX SKIP COUNT COMMAND... runs COMMAND
# under Nsight Compute and writes to LOG why the kernels whose names match REGEX take their time:
# the speed-of-light, occupancy, launch, warp-stall, scheduler, compute and memory-workload
# sections for COUNT of their launches after the first SKIP, at the clocks a run has (METHOD:
# ncu's default locks base clocks).
ncu_detail() {
  local ncu=$1 log=$2 regex=$3 skip=$4 count=$5
  shift 5
  "$ncu" --clock-control none --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --log-file "$log" "$@"
}
