#!/usr/bin/env bash
# make bench-keys: what the number of stored keys costs a claim, per key
# layout and kind of message ID, in a Postgres of its own whose memory is
# capped well below the big key table (a memory cgroup: run as root).
#
#   KEYS       keys in the big table (default 10000000; 30000000 for the long run)
#   MEM        the server's memory cap (default 16 bytes per key: 160M for 10M keys)
#   CASES      layout/ids cases (default single-table/v4,single-table/v7,partitioned/v4,partitioned/v7)
#   SHARED_BUFFERS the server's shared_buffers, inside the cap (default 16MB)
#   BENCH_ARGS more flags for tools/keybench (-dur, -rounds, -clients)
#   BENCH_CONF more postgresql.conf lines for the server (e.g. plan_cache_mode = force_custom_plan)
#   BENCH_PG_PORT, BENCH_DIR  where the server listens and lives (default 56432, /tmp/exactly-bench-keys)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
keys=${KEYS:-10000000}
mem=${MEM:-$((keys * 16 / 1048576 > 64 ? keys * 16 / 1048576 : 64))M}
cases=${CASES:-single-table/v4,single-table/v7,partitioned/v4,partitioned/v7}
port=${BENCH_PG_PORT:-56432}
dir=${BENCH_DIR:-/tmp/exactly-bench-keys}
GO=${GO:-go}

[ "$(id -u)" = 0 ] || { echo "bench-keys: run as root (the server's memory cap is a cgroup)" >&2; exit 1; }
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/initdb" ] || { echo "bench-keys: no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)" >&2; exit 1; }

if [ -d /sys/fs/cgroup/memory ]; then cg=/sys/fs/cgroup/memory/exactly-bench-keys; else cg=/sys/fs/cgroup/exactly-bench-keys; fi
stop() {
	runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
	rmdir "$cg" 2>/dev/null || true
}
trap stop EXIT
stop
if [ -d /sys/fs/cgroup/memory ]; then # cgroup v1
	mkdir -p "$cg"
	limit=$cg/memory.limit_in_bytes
	procs=$cg/cgroup.procs
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then # cgroup v2
	mkdir -p "$cg"
	limit=$cg/memory.max
	procs=$cg/cgroup.procs
else
	echo "bench-keys: no memory cgroup under /sys/fs/cgroup" >&2
	exit 1
fi

rm -rf "$dir"
mkdir -p "$dir"
chown postgres "$dir"
runuser -u postgres -- "$bin/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_buffers = ${SHARED_BUFFERS:-16MB}
work_mem = 2MB
maintenance_work_mem = 8MB
max_wal_size = 8GB
checkpoint_timeout = 5min
${BENCH_CONF:-}
CONF
# Filled with memory to spare (keybench -fill-mem), measured under the cap.
echo 4G >"$limit"
# The postmaster and every backend run in the cgroup, niced: the machine is shared.
sh -c "echo \$\$ >$procs && exec nice -n 10 runuser -u postgres -- $bin/pg_ctl -D $dir/data -l $dir/log -w start" >/dev/null
echo "bench-keys: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on port $port, memory capped at $mem, $keys keys" >&2
cd "$here"
nice -n 10 $GO run ./tools/keybench -dsn "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" \
	-keys "$keys" -mem "$mem" -cases "$cases" -cgroup-limit "$limit" ${BENCH_ARGS:-}
