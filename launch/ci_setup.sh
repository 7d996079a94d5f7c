#!/usr/bin/env bash
# Installs what the launch integration tests need: a real Slurm (slurmctld + slurmd), munge, iproute2 (ip netns)
# and shellcheck. Idempotent; runs as root in CI. The Slurm daemons themselves are started per test session by
# tests/launch/slurm_cluster.py in a temp folder, so this script only installs packages and the munge key.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "launch/ci_setup.sh: not root; skipping package install (Slurm/netns tests will skip)" >&2
  exit 0
fi

need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)

if [ "${#need[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The munge key normally comes with the package; create it if a minimal image dropped it.
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  if command -v mungekey >/dev/null 2>&1; then
    mungekey -c -f -k /etc/munge/munge.key
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge: /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
echo "launch/ci_setup.sh: slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null || echo '?'), munge, ip, shellcheck ready"
