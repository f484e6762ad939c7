# shellcheck shell=sh
# The node report (sparkrig/node.py Node): key=value lines, then the end marker.
# $1 where the weights land, $2 the fabric interface, $3 sparkrig's own netplan file,
# $4 the fabric netdevs' names as an ERE, $5 the ERE of a netplan line naming one of them,
# $6... those netdevs (more than one: NM profiles are matched by each one's MAC)
d=$1 iface=$2 ours=$3 iface_re=$4 netplan_re=$5
shift 5
if [ $# -gt 1 ]; then
  mac=; for x in "$@"; do
    m=; read -r m 2>/dev/null < "/sys/class/net/$x/address"; [ -n "$m" ] && mac="$mac${mac:+|}$m"
  done; mac="(${mac:-none})"
else
  mac=; read -r mac 2>/dev/null < "/sys/class/net/$iface/address"; mac=${mac:-none}
fi
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
# few processes (a process start is most of this script's time on a busy node): sysfs and
# meminfo are read by the shell's own read; the sysctls by one cat, since dash reads a byte at a
# time and a sysctl file read at an offset past 0 returns nothing ("60" would read as "6")
# shellcheck disable=SC2046  # the two values, split into $1 and $2
set -- $(cat /proc/sys/vm/swappiness /proc/sys/vm/min_free_kbytes)
echo "swappiness=$1"; echo "min_free_kbytes=$2"
while read -r k v _; do
  case $k in MemTotal:) echo "memtotal_kb=$v" ;; MemFree:) echo "memfree_kb=$v"; break ;; esac
done < /proc/meminfo
# shellcheck disable=SC2046  # the release and the machine, split into $1 and $2
set -- $(uname -mr); echo "arch=$2"; echo "kernel=$1"
if command -v nvidia-smi >/dev/null 2>&1; then
  q=name,compute_cap,driver_version
  echo "gpu=$(nvidia-smi --query-gpu=$q --format=csv,noheader 2>/dev/null | head -n1)"
fi
echo "docker=$(command -v docker || true)"
echo "disk_free=$(df -P -B1 "$d" 2>/dev/null | awk 'NR==2 {print $4}')"
n=/sys/class/net/$iface
if [ -d "$n" ]; then
  echo "link_present=1"
  v=; read -r v 2>/dev/null < "$n/operstate"; echo "operstate=$v"
  v=; read -r v 2>/dev/null < "$n/flags"; echo "flags=$v"
  v=0; read -r v 2>/dev/null < "$n/carrier" || v=0; echo "carrier=$v"
  read -r v < "$n/mtu"; echo "mtu=$v"
  echo "ipv4=$(ip -o -4 addr show dev "$iface" 2>/dev/null | awk '{print $4}' | paste -sd, -)"
else
  echo "link_present=0"
  l=; for d in /sys/class/net/*; do  # what the operator may have meant: name:operstate
    v=; read -r v 2>/dev/null < "$d/operstate"; l="$l${l:+,}${d##*/}:$v"
  done; echo "netdevs=$l"
fi
echo "networkmanager=$(systemctl is-active NetworkManager 2>/dev/null)"
for f in /lib/netplan/*.yaml /etc/netplan/*.yaml /run/netplan/*.yaml; do
  [ -f "$f" ] && [ "$f" != "$ours" ] || continue
  grep -qE "$netplan_re" "$f" && echo "netplan_claim=$f"
done
for f in /etc/NetworkManager/system-connections/* /run/NetworkManager/system-connections/*; do
  [ -f "$f" ] || continue
  case ${f##*/} in netplan-*) continue ;; esac
  if grep -qixE "interface-name=$iface_re|mac-address=$mac" "$f"; then
    echo "nm_claim=$f|$(sed -n 's/^id=//p' "$f" | head -n1)"
  fi
done
echo '##SPARKRIG-END##'
