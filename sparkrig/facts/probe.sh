# shellcheck shell=sh
# init's read-only probe of a box (sparkrig/probe.py), run over SSH by ``sh -s``: key=value
# lines; the probe adds the apt archive and the baseline's lines after them. $1 the directory
# whose free space the weights would use.
# Every line is a read: no file is written, no service touched (``sudo -n true`` asks sudo
# whether it would need a password, and does nothing else).
echo "hostname=$(hostname)"
echo "user=$(id -un)"
S=
if [ "$(id -u)" = 0 ]; then echo sudo=root
elif sudo -n true 2>/dev/null; then echo sudo=nopasswd; S="sudo -n"
elif command -v sudo >/dev/null 2>&1; then echo sudo=password
else echo sudo=none; fi
echo "ntp=$(timedatectl show -p NTP --value 2>/dev/null)"
echo "ntp_synced=$(timedatectl show -p NTPSynchronized --value 2>/dev/null)"
echo "docker=$(command -v docker || true)"
echo "nginx=$(PATH=$PATH:/usr/sbin command -v nginx || true)"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
fi
echo "disk_free=$(df -P -B1 "$1" 2>/dev/null | awk 'NR==2 {print $4}')"
for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue
  n=
  for x in "$d"/device/net/*; do [ -e "$x" ] && n=${x##*/} && break; done
  [ -n "$n" ] || { read -r n 2>/dev/null < "$d/ports/1/gid_attrs/ndevs/0" || n=; }
  [ -n "$n" ] || continue
  s=/sys/class/net/$n; o=; c=0; m=0
  read -r o 2>/dev/null < "$s/operstate"; read -r c 2>/dev/null < "$s/carrier" || c=0
  read -r m 2>/dev/null < "$s/mtu"
  p=$(readlink -f "$s/device" 2>/dev/null); p=${p##*/}
  a=$(ip -o -4 addr show dev "$n" 2>/dev/null | awk '{print $4}' | paste -sd, -)
  echo "rdma=${d##*/}|$n|$o|$c|$m|$p|$a"
done
ip -o -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) {
  if ($i == "via") g = $(i + 1); if ($i == "dev") d = $(i + 1) } print "route=" d "|" g }'
for f in /lib/netplan/*.yaml /etc/netplan/*.yaml /run/netplan/*.yaml; do  # root's 0600 files
  [ -f "$f" ] || continue
  n=$($S grep -oE '(en|eth|ib)[A-Za-z0-9]+' "$f" 2>/dev/null) ||
    { [ -r "$f" ] || [ -n "$S" ] || { echo "netplan_unread=$f"; continue; }; }
  echo "netplan=$f|$(echo "$n" | sort -u | paste -sd, -)"
done
