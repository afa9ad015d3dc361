#!/usr/bin/env bash
# nginx (a master and one worker) serving a small static
# file to wrk (HTTP/1.1) and h2load (h2c), all unmodified, over X-IO
# (under LD_PRELOAD=libxio_preload.so) next to the same programs over TCP
# loopback, in one run: nginx on CPU 1, the load on CPU 0. Needs Debian's
# nginx, wrk and nghttp2-client. Prints requests/s and wrk's latency.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p xio-preload -p xio-manager
target=${CARGO_TARGET_DIR:-target}/release
lib=$(realpath "$target/libxio_preload.so")
dir=$(mktemp -d)
# nginx's worker runs as nobody when the master runs as root: it reads
# the files, reaches the manager's socket, and is admitted to the pool.
chmod 755 "$dir"
export XIO_PREFIX=nginx-bench-$$ XIO_RUN_DIR=$dir
"$target/xio-manager" --prefix "$XIO_PREFIX" --allow-uid nobody >/dev/null 2>&1 &
mgr=$!
trap 'kill $mgr 2>/dev/null; rm -rf "$dir"' EXIT
# A listener opened before the manager answers stays with the kernel.
until "$target/xio-manager" --prefix "$XIO_PREFIX" status >/dev/null 2>&1; do sleep 0.1; done
mkdir -p "$dir/html" "$dir/logs"
echo "hello from nginx" >"$dir/html/index.html"
conf() { # http port, h2c port
    cat <<CONF
daemon off;
master_process on;
worker_processes 1;
error_log $dir/logs/error.log;
pid $dir/nginx-$1.pid;
events { worker_connections 4096; }
http {
  access_log off;
  # sendfile on stalls TCP's h2c here (23 requests/s: Nagle against
  # delayed ACKs), which would flatter X-IO.
  sendfile off;
  client_body_temp_path $dir/tmp;
  server {
    listen 127.0.0.1:$1;
    listen 127.0.0.1:$2 http2;
    root $dir/html;
  }
}
CONF
}
bench() { # label, LD_PRELOAD value (empty: none), http port, h2c port
    conf "$3" "$4" >"$dir/nginx-$3.conf"
    LD_PRELOAD=$2 taskset -c 1 nginx -c "$dir/nginx-$3.conf" -p "$dir" &
    local srv=$!
    until LD_PRELOAD=$2 curl -sf "http://127.0.0.1:$3/" >/dev/null; do sleep 0.1; done
    for c in 1 16 64 256; do
        local w h
        w=$(LD_PRELOAD=$2 taskset -c 0 wrk -t1 -c"$c" -d2s --latency "http://127.0.0.1:$3/" |
            awk '/^ +50%/ {p=$2} /Requests\/sec/ {r=$2} END {printf "%.0f | %s", r, p}')
        h=$(LD_PRELOAD=$2 taskset -c 0 h2load -n $((c * 400 > 20000 ? c * 400 : 20000)) -c"$c" \
            "http://127.0.0.1:$4/" | awk '/^finished in/ {printf "%.0f", $4}')
        echo "| $1 | $c | $w | $h |"
    done
    kill "$srv"
    wait "$srv" 2>/dev/null || true
}
echo "| transport | connections | wrk requests/s | wrk p50 | h2load (h2c) requests/s |"
echo "|---|---:|---:|---:|---:|"
bench X-IO "$lib" 7501 7502
bench TCP "" 7503 7504
