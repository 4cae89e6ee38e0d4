# Sourced by the device scripts: the library path for the ossrt pack in $PACK (tools/device/cuda_pack.sh).
# cuBLASLt and NCCL come from the device's CUDA toolkit or torch's wheels; our other libraries travel
# in $PACK/lib. Sets CUBLAS_DIR and NCCL_DIR (for scripts that report them) and exports LD_LIBRARY_PATH;
# PACK defaults to .carry/cuda and OSSRT_SOURCE_DIR (the tests' fixtures) to the repo root, the
# current directory of every device call.
export PACK=${PACK:-$(pwd)/.carry/cuda}
export OSSRT_SOURCE_DIR=${OSSRT_SOURCE_DIR:-$(pwd)}
CUBLAS_DIR=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)")
NCCL_DIR=$(dirname "$(find /usr /opt -maxdepth 9 -name 'libnccl.so.2*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$PACK/lib:$CUBLAS_DIR:$NCCL_DIR:${LD_LIBRARY_PATH:-}
