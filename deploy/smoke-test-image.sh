#!/usr/bin/env bash
# Smoke test of the built image on a machine where `podman run` is not allowed (as root): mount
# the image, lay out what the Kubernetes pod gets (the init container's seeding of a 0777 emptyDir
# as uid 10001, bind mounts at the VOLUME paths like its subPath mounts, /proc, a tmpfs /tmp), run
# the image's CMD in a chroot as uid 10001, query it over loopback, hot-deploy a backend into the
# pod's backend directory, stop it with SIGTERM. Not run by CI: docs/deploy.md shows a run.
#
#   deploy/smoke-test-image.sh [IMAGE]        (default localhost/backplane:0.1.0)
set -euo pipefail
image="${1:-localhost/backplane:0.1.0}"
source_dir="$(cd "$(dirname "$0")/.." && pwd)"
url=http://127.0.0.1:8000  # the image's config listens on 0.0.0.0:8000
for tool in podman chroot curl jq /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "smoke-test-image: $tool is needed" >&2; exit 2; }
done
if [[ $(id -u) != 0 ]]; then echo "smoke-test-image: run as root (mounts, chroot)" >&2; exit 2; fi
if curl -s -o /dev/null --max-time 2 "$url/"; then
  echo "smoke-test-image: something already listens on 127.0.0.1:8000" >&2
  exit 2
fi

podman image ls "$image"
root="$(podman image mount "$image")"
work="$(mktemp -d)"
mounted=()
pid=""
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  set +e
  if [[ -n "$pid" ]]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}"; done
  podman image unmount "$image" >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }
as_backplane() { chroot --userspec=10001:10001 "$root" "$@"; }

step "the image's configuration, as the server resolves it"
podman image inspect "$image" --format '{{json .Config}}'
as_backplane backplane serve --check-config --config /etc/backplane/config.json

step "the pod's file systems"
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp" && mounted+=("$root/tmp")
mount -t tmpfs -o mode=0777 tmpfs "$root/mnt" && mounted+=("$root/mnt")  # the emptyDir
seed="$(/usr/bin/python3 -c 'import sys, yaml
pod = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]
print(pod["initContainers"][0]["command"][2])' "$source_dir/deploy/kubernetes/deployment.yaml")"
as_backplane /bin/sh -ec "${seed//\/state/\/mnt}"  # the init container, with /mnt for /state
ls -la "$root/mnt/backends"
for directory in backends models; do
  mount --bind "$root/mnt/$directory" "$root/var/lib/backplane/$directory"
  mounted+=("$root/var/lib/backplane/$directory")
done

step "the image's CMD, as uid 10001, with the admin token in the environment"
# chroot itself, not the function: each program execs the next, so $! is the server's pid.
chroot --userspec=10001:10001 "$root" /usr/bin/env -i BACKPLANE_ADMIN_TOKEN=smoke-token /bin/sh -c \
  'cd /var/lib/backplane && exec backplane serve --config /etc/backplane/config.json' \
  >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q "listening on" "$work/serve.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done
cat "$work/serve.log"

step "probes, an MNIST inference, the admin token"
curl -sS -w ' %{http_code}\n' "$url/v2/health/live"
curl -sS -w ' %{http_code}\n' "$url/v2/health/ready"
request="$root/usr/share/backplane/models/mnist/example_request.json"
curl -sS -X POST --data @"$request" "$url/v2/models/mnist/infer" | tee "$work/answer.json"
echo
[[ $(jq '.outputs[0].data | index(max)' "$work/answer.json") == 5 ]] || {
  echo "smoke-test-image: MNIST test image 0 is not classified as a 5" >&2
  exit 1
}
curl -sS "$url/v2/backends/CpuRef" | jq -c '{id, active_generation, file, pinned}'
curl -sS -o /dev/null -w 'pin without the token: %{http_code}\n' -X POST \
  "$url/v2/backends/CpuRef/pin"

step "a new CpuRef version published into the pod's backend directory (copy, then rename)"
cp "$root/usr/lib/backplane/backends/Backplane_CpuRef_backend.so.0.1.0" "$root/mnt/backends/.new"
chown 10001:10001 "$root/mnt/backends/.new"
as_backplane mv /var/lib/backplane/backends/.new /var/lib/backplane/backends/Backplane_CpuRef_backend.so
for _ in $(seq 100); do
  [[ $(curl -sS "$url/v2/backends/CpuRef" | jq .active_generation) == 2 ]] && break
  sleep 0.1
done
curl -sS "$url/v2/backends/CpuRef" |
  jq -c '{active_generation, generations: [.generations[] | {generation, state}]}'
curl -sS -X POST --data @"$request" "$url/v2/models/mnist/infer" | jq -c '.outputs[0].data'
curl -sS "$url/metrics" |
  grep -E '^backplane_(inference_requests_total|backend_active_generation|backend_swaps_total)'

step "SIGTERM"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
tail -4 "$work/serve.log"
echo "exit status $status"
exit "$status"
