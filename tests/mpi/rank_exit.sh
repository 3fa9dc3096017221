#!/bin/sh
# rank_exit.sh SECONDS MPIRUN... : runs test_mpi_rank_exit under `MPIRUN...` (mpirun
# -np 2 and the program) and passes when the job ends on its own within SECONDS,
# in failure, after the last rank exited: the surviving ranks' forward either
# failed (an MPI error: "forward returned SNEPPX_ERR_COMM") or mpirun ended them.
# A forward that returned SNEPPX_OK, or a job still running at SECONDS, fails.
limit=$1
shift
output=$(timeout -s KILL "$limit" "$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ "$status" -eq 137 ]; then
  echo "rank_exit.sh: FAIL: the job was still running after $limit s (a rank waits forever on the dead one)"
  exit 1
fi
if [ "$status" -eq 0 ]; then
  echo "rank_exit.sh: FAIL: the job succeeded though a rank died"
  exit 1
fi
case "$output" in
  *"exits without MPI_Finalize"*) ;;
  *) echo "rank_exit.sh: FAIL: the last rank never reached its exit"; exit 1 ;;
esac
case "$output" in
  *"forward returned SNEPPX_OK"*) echo "rank_exit.sh: FAIL: a forward succeeded without the dead rank"; exit 1 ;;
esac
echo "rank_exit.sh: passed: the job ended (status $status) after the last rank's exit"
