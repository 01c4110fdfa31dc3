#!/usr/bin/env bash
# Several "hosts" on this machine: one network namespace each, with its own host name, joined through a
# bridge by veth pairs whose every direction is shaped with tc (rate and delay). Open MPI launches across
# them as across nodes: its rsh launcher runs this script's `rsh` instead of ssh, which enters the host's
# namespace with an environment as bare as an ssh login's, so the ranks of the other hosts get only what
# the launcher forwards (-x); the TCP BTL carries the traffic between hosts, shared memory stays inside one.
# Traffic stays between the namespaces: the bridge lives in a namespace of its own and no address of this
# machine is on it.
#
#   scripts/cluster.sh up N [--rate 1gbit] [--delay 20us] [--name gsc] [--subnet 10.213.7]
#                           [--clock-offset HOST=NS]...
#       N hosts named NAME-h0 .. NAME-h<N-1> (0 < N <= 16), addresses SUBNET.1 ...; every link at RATE
#       each way (tc htb; `unlimited`: not shaped, as fast as the CPUs move bytes), delayed by DELAY
#       (tc netem; refused where the kernel lacks it); --clock-offset shifts the wall clock the gradscope
#       agent reads on HOST by NS nanoseconds (a test of merge's alignment).
#   scripts/cluster.sh shape HOST --rate R [--delay D] [--name gsc]   one host's link, both directions
#   scripts/cluster.sh exec HOST [--name gsc] -- COMMAND...           COMMAND on HOST; mpirun started
#       there launches on every host (the hostfile lists them, each with slots for SLOTS ranks)
#   scripts/cluster.sh status|down [--name gsc]
#   scripts/cluster.sh check       exit 0 where namespaces can be made here, 77 (with the reason) where not
#   scripts/cluster.sh rsh NAME HOST COMMAND...                       what Open MPI calls instead of ssh
#
# Environment: GRADSCOPE_CLUSTER_SLOTS (ranks per host in the hostfile, default 2).
set -euo pipefail

script=$(readlink -f "${BASH_SOURCE[0]}")
state_root=/run/gradscope-cluster

die() {
  echo "cluster.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '2,22p' "$script" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Whether a scratch namespace's veth takes the queueing discipline `tc qdisc add dev gsa root ARGS...`:
# 0 yes; 1 no namespace; 2 no veth pair; 3 not that discipline. The namespace goes again.
probe_qdisc() {
  local probe="gsprobe$$" status=0
  ip netns add "$probe" 2>/dev/null || return 1
  if ! ip netns exec "$probe" ip link add gsa type veth peer name gsb 2>/dev/null; then
    status=2
  elif ! ip netns exec "$probe" tc qdisc add dev gsa root "$@" 2>/dev/null; then
    status=3
  fi
  ip netns del "$probe" 2>/dev/null || true
  return "$status"
}

# Why namespaces cannot be made here, or nothing.
why_not() {
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc)"; return; }
  for tool in ip tc unshare; do
    command -v "$tool" >/dev/null 2>&1 || { echo "needs $tool (iproute2, util-linux)"; return; }
  done
  local status=0
  probe_qdisc handle 1: htb default 1 || status=$?
  case "$status" in
    1) echo "cannot create a network namespace here (a container without CAP_SYS_ADMIN?)" ;;
    2) echo "cannot create veth pairs" ;;
    3) echo "cannot shape links with tc htb (kernel without sch_htb)" ;;
  esac
}

name=gsc
rate=1gbit
delay=0
subnet=10.213.7
offsets=()
parse_common() {
  rest=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) name=${2:?--name needs a value}; shift 2 ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
      --clock-offset) offsets+=("${2:?--clock-offset needs HOST=NS}"); shift 2 ;;
      --) shift; rest+=("$@"); break ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  [[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name $name: 1 to 8 lower-case letters and digits, a letter first"
  [[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet $subnet: three numbers, e.g. 10.213.7"
}

# A delay needs netem, which some kernels (this project's VMs among them) are built without.
check_delay() {
  [ "$delay" = 0 ] && return
  probe_qdisc netem delay "$delay" ||
    die "--delay $delay: this kernel has no netem (sch_netem), so links can be rate-limited but not delayed; leave --delay out"
}

state() { echo "$state_root/$name"; }
host_ns() { echo "$name-h$1"; }
switch_ns() { echo "$name-sw"; }

# tc on DEV inside namespace NS: an HTB class at the rate (netem, where the kernel has it, for the delay);
# no shaping at all for the rate `unlimited` (a delay needs a rate then).
shape_dev() {
  local ns=$1 dev=$2 r=$3 d=$4
  # (htb cannot replace itself: a changed link starts from a fresh root.)
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
  [ "$r" != unlimited ] || return 0
  ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 1
  ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:1 htb rate "$r" ceil "$r" burst 256k cburst 256k quantum 65536
  if [ "$d" != 0 ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$d" limit 100000
  fi
}

hosts_count() {
  [ -f "$(state)/hosts" ] || die "no cluster named $name is up (scripts/cluster.sh up N)"
  wc -l <"$(state)/hosts"
}

cmd_up() {
  local n=${rest[0]:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 16 ] || die "up N: N hosts, 1 to 16"
  local reason
  reason=$(why_not)
  [ -z "$reason" ] || die "$reason"
  check_delay
  [ ! -e "$(state)" ] || die "a cluster named $name is up already; scripts/cluster.sh down --name $name first"
  local slots=${GRADSCOPE_CLUSTER_SLOTS:-2}
  [[ "$slots" =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || die "GRADSCOPE_CLUSTER_SLOTS=$slots: a positive number"
  local -A offset_of=()
  for entry in "${offsets[@]+"${offsets[@]}"}"; do
    [[ "$entry" =~ ^([0-9]+)=(-?[0-9]+)$ ]] || die "--clock-offset $entry: HOST=NS, e.g. 1=5000000"
    [ "${BASH_REMATCH[1]}" -lt "$n" ] || die "--clock-offset $entry: there are hosts 0 to $((n - 1))"
    offset_of[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
  done
  mkdir -p "$(state)"
  trap 'cmd_down >/dev/null 2>&1; exit 2' ERR
  local sw
  sw=$(switch_ns)
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  : >"$(state)/hosts"
  : >"$(state)/hostfile"
  local hosts_text=""
  for ((i = 0; i < n; i++)); do hosts_text+="$subnet.$((i + 1)) $(host_ns "$i")"$'\n'; done
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(host_ns "$i")
    ip netns add "$ns"
    # ip netns exec bind-mounts /etc/netns/NS/hosts over /etc/hosts: each host resolves the others' names.
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n%s' "$hosts_text" >"/etc/netns/$ns/hosts"
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    shape_dev "$ns" eth0 "$rate" "$delay"
    shape_dev "$sw" "p$i" "$rate" "$delay"
    echo "$ns $subnet.$((i + 1)) ${offset_of[$i]:-0} $rate $delay" >>"$(state)/hosts"
    echo "$ns slots=$slots" >>"$(state)/hostfile"
  done
  # What Open MPI calls instead of ssh (it takes a program, not a command line).
  echo "$subnet" >"$(state)/subnet"
  printf '#!/bin/sh\nexec "%s" rsh "%s" "$@"\n' "$script" "$name" >"$(state)/rsh"
  chmod +x "$(state)/rsh"
  trap - ERR
  echo "cluster $name: $n hosts ($(host_ns 0) .. $(host_ns $((n - 1)))), links $rate, delay $delay each way"
}

cmd_down() {
  local sw
  sw=$(switch_ns)
  if [ -f "$(state)/hosts" ]; then
    while read -r ns _; do
      # Processes still inside (a job that outlived its test) would keep the namespace alive.
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
      rm -rf "/etc/netns/$ns"
    done <"$(state)/hosts"
  fi
  # Namespaces of an `up` that failed half-way, before the hosts file listed them.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-h[0-9]+$" || true); do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  ip netns del "$sw" 2>/dev/null || true
  rm -rf "$(state)"
}

cmd_shape() {
  local host=${rest[0]:-}
  local n
  n=$(hosts_count)
  [[ "$host" =~ ^[0-9]+$ ]] && [ "$host" -lt "$n" ] || die "shape HOST: a host number, 0 to $((n - 1))"
  check_delay
  shape_dev "$(host_ns "$host")" eth0 "$rate" "$delay"
  shape_dev "$(switch_ns)" "p$host" "$rate" "$delay"
  awk -v h="$(host_ns "$host")" -v r="$rate" -v d="$delay" '$1 == h { $4 = r; $5 = d } { print }' \
    "$(state)/hosts" >"$(state)/hosts.new"
  mv "$(state)/hosts.new" "$(state)/hosts"
}

cmd_status() {
  hosts_count >/dev/null
  echo "cluster $name (hostfile $(state)/hostfile):"
  while read -r ns address offset r d; do
    local clock=""
    [ "$offset" = 0 ] || clock=", its clock $offset ns off"
    echo "  $ns $address: link $r each way, delay $d$clock"
  done <"$(state)/hosts"
}

# Runs COMMAND inside host HOST's namespace under its own host name; CLEAN: with an ssh-like environment.
enter() {
  local host_line=$1 clean=$2
  shift 2
  local ns offset
  ns=$(echo "$host_line" | awk '{print $1}')
  offset=$(echo "$host_line" | awk '{print $3}')
  local environment=()
  if [ "$clean" = 1 ]; then
    environment=(env -i "PATH=$PATH" "HOME=${HOME:-/root}" "USER=${USER:-root}" "SHELL=/bin/sh")
    # The sanitizers' options pass, as a site's login environment would hold them: a sanitizer build's
    # tests suppress Open MPI's own reports with them on every host.
    for name in ASAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS UBSAN_OPTIONS; do
      [ -z "${!name:-}" ] || environment+=("$name=${!name}")
    done
  else
    environment=(env)
  fi
  if [ "$offset" != 0 ]; then environment+=("GRADSCOPE_TEST_CLOCK_OFFSET=$offset"); fi
  exec ip netns exec "$ns" unshare --uts "${environment[@]}" sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

cmd_exec() {
  local host=${rest[0]:-}
  local n
  n=$(hosts_count)
  [[ "$host" =~ ^[0-9]+$ ]] && [ "$host" -lt "$n" ] || die "exec HOST -- COMMAND: a host number, 0 to $((n - 1))"
  [ ${#rest[@]} -ge 2 ] || die "exec HOST -- COMMAND: no command"
  local line
  line=$(sed -n "$((host + 1))p" "$(state)/hosts")
  subnet=$(cat "$(state)/subnet")
  # Open MPI: launch on the hosts of the hostfile through `rsh`, carry MPI and its wire-up over the
  # hosts' own addresses, allow root (the test machines run as root), and yield when ranks outnumber
  # cores.
  export OMPI_MCA_plm_rsh_agent="$(state)/rsh"
  export OMPI_MCA_plm_rsh_no_tree_spawn=1
  export OMPI_MCA_orte_default_hostfile="$(state)/hostfile"
  export OMPI_MCA_btl=self,vader,tcp
  export OMPI_MCA_btl_tcp_if_include="$subnet.0/24"
  export OMPI_MCA_oob_tcp_if_include="$subnet.0/24"
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_mpi_yield_when_idle=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  enter "$line" 0 "${rest[@]:1}"
}

cmd_rsh() {
  # Open MPI calls: rsh HOSTNAME COMMAND-LINE (as it would ssh: one shell command line, maybe in pieces).
  [ $# -ge 2 ] || die "rsh NAME HOST COMMAND: what Open MPI runs instead of ssh"
  name=$1
  local host=$2
  shift 2
  local line
  line=$(awk -v h="$host" '$1 == h || $2 == h' "$(state)/hosts")
  [ -n "$line" ] || die "rsh: no host $host in cluster $name"
  enter "$line" 1 /bin/sh -c "$*"
}

[ $# -ge 1 ] || usage
command=$1
shift
case "$command" in
  check)
    reason=$(why_not)
    if [ -n "$reason" ]; then
      echo "cluster.sh: $reason" >&2
      exit 77
    fi
    ;;
  up) parse_common "$@"; cmd_up ;;
  down) parse_common "$@"; cmd_down ;;
  shape) parse_common "$@"; cmd_shape ;;
  status) parse_common "$@"; cmd_status ;;
  exec) parse_common "$@"; cmd_exec ;;
  rsh) cmd_rsh "$@" ;;
  -h | --help | help) usage ;;
  *) die "unknown command $command (up, down, shape, exec, status, check)" ;;
esac
