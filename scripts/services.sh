#!/usr/bin/env bash
# Makes sure PostgreSQL (5432), Redis (6379) and NATS with JetStream (4222) answer on loopback.
# Idempotent: a service that answers is left alone; one that is installed but stopped is started;
# one that is missing is installed with apt-get (root on Debian only). Says what it did.
set -euo pipefail

log() { echo "[services] $*"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && exec 3>&- 3<&-; }
wait_port() {
  local port=$1 name=$2
  for _ in $(seq 1 60); do port_open "$port" && return 0; sleep 0.5; done
  log "ERROR: $name did not start listening on 127.0.0.1:$port"; return 1
}

APT_UPDATED=0
apt_install() {
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null; then
    log "ERROR: $* missing and I cannot install it (need root on Debian). Install it and re-run."; exit 1
  fi
  if [ "$APT_UPDATED" = 0 ]; then log "apt-get update"; DEBIAN_FRONTEND=noninteractive apt-get update -qq; APT_UPDATED=1; fi
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_postgres() {
  if port_open 5432; then log "postgresql: already running"; else
    command -v pg_ctlcluster >/dev/null || [ -d /usr/lib/postgresql ] || apt_install postgresql
    local ver; ver=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
    if [ -z "$ver" ]; then apt_install postgresql; ver=$(ls /etc/postgresql | sort -V | tail -n1); fi
    log "postgresql: starting cluster $ver/main"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    wait_port 5432 postgresql
  fi
  # ax connects as postgres over TCP without a password (loopback trust, as on the dev machines).
  local hba; hba=$(ls /etc/postgresql/*/main/pg_hba.conf 2>/dev/null | head -n1 || true)
  if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1 && [ -n "$hba" ] && [ "$(id -u)" = 0 ]; then
    log "postgresql: enabling trust auth on loopback in $hba"
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    su postgres -c "psql -Atc 'select pg_reload_conf()'" >/dev/null
  fi
  if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc "select 1 from pg_database where datname='ax'" | grep -q 1; then
    log "postgresql: creating database ax"
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'create database ax' || true
  fi
}

ensure_redis() {
  if port_open 6379; then log "redis: already running"; return; fi
  command -v redis-server >/dev/null || apt_install redis-server
  log "redis: starting"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
  wait_port 6379 redis
}

ensure_nats() {
  if port_open 4222; then log "nats: already running"; return; fi
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
  local bin; bin=$(command -v nats-server || echo /usr/sbin/nats-server)
  local dir=${AX_NATS_STORE:-/var/lib/nats-server}
  mkdir -p "$dir"
  log "nats: starting with JetStream (store $dir)"
  nohup "$bin" -a 127.0.0.1 -p 4222 -js -sd "$dir" >>/tmp/ax-nats-server.log 2>&1 &
  wait_port 4222 nats
}

command -v psql >/dev/null || apt_install postgresql-client
ensure_postgres
ensure_redis
ensure_nats
log "all services answer on loopback (pg 5432, redis 6379, nats 4222)"
