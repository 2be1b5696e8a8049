# The carried wheels (.whl/, see README "GPU machine") installed once into /tmp/site and put on
# PYTHONPATH. Sourced from the repository root by gpu_env.sh and gpu_ab_build.sh.
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -d /tmp/site ] || "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
