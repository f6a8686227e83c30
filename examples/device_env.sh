# Sourced by the fixture scripts run on the GPU machine: NVLink multicast off, the Python and nsys to use, and the
# libdw/libelf that nsys's importer needs where the machine lacks them (Debian libdw1 and libelf1 unpacked into
# .nsysdeps/ with dpkg -x). Run from the repository root.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
NSYS=${NSYS:-$(command -v nsys || echo /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys)}
[ -d .nsysdeps ] && export LD_LIBRARY_PATH=$PWD/.nsysdeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
