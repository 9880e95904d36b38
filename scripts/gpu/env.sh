# Sourced by the GPU scripts: the environment mpirun, NCCL and cuDNN need on a GPU machine.
# mpirun as root; NVLink multicast off (it can take shared GPUs out of service).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# cuDNN (the convolution layer loads it): the system's, else a pip wheel's (nvidia-cudnn-cu*).
if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9' && [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]; then
  d=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null) \
    && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
fi
