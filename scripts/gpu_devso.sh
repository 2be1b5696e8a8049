# A build carried from the CPU machine (scripts/build_device_extension.sh NAME -> .devso/NAME.so)
# put in place when MOE_BACKEND_DEVSO names one; sourced from the repository root by gpu_env.sh
# and gpu_check.sh. Sets devso_loaded=1 when it loads here; else removes it (the caller builds).
# Its rpath names the build machine's NVSHMEM wheel, so this machine's goes on the library path.
devso_loaded=0
if [ -n "${MOE_BACKEND_DEVSO:-}" ] && [ -f ".devso/$MOE_BACKEND_DEVSO.so" ]; then
  suffix=$("${PYTHON:-python3}" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  cp ".devso/$MOE_BACKEND_DEVSO.so" "moe_backend/_C$suffix"
  nvlib=$("${PYTHON:-python3}" -c "import sys; sys.path.insert(0, 'csrc'); from build import nvshmem_root; print(nvshmem_root() + '/lib')")
  export LD_LIBRARY_PATH=$nvlib:${LD_LIBRARY_PATH:-}
  if "${PYTHON:-python3}" -c "import torch, moe_backend._C" 2>/dev/null; then
    devso_loaded=1
  else
    echo "the carried .devso/$MOE_BACKEND_DEVSO.so does not load here: building"
    rm -f moe_backend/_C*.so
  fi
fi
