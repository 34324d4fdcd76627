#!/usr/bin/env bash
# Make a Docker engine reachable for the tests marked `docker`, if this machine allows it:
# install the Debian docker.io package when no dockerd is present, then start
#   dockerd --storage-driver=vfs --iptables=false --bridge=none
# (no bridge network: the docker runtime's default unix-socket transport needs none).
# Never fails the build: without an engine the docker tests skip and say why.
set -uo pipefail

if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  echo "docker: engine already reachable"; exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "docker: not root, cannot start dockerd; docker tests will skip"; exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "docker: installing docker.io"
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io) \
    >/tmp/leanrl-docker-install.log 2>&1 \
    || { echo "docker: install failed (see /tmp/leanrl-docker-install.log)"; exit 0; }
fi
nohup dockerd --storage-driver=vfs --iptables=false --bridge=none \
  >/tmp/leanrl-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    echo "docker: dockerd started"; exit 0
  fi
  sleep 0.5
done
echo "docker: dockerd did not come up (see /tmp/leanrl-dockerd.log); docker tests will skip"
exit 0
