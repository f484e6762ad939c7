# shellcheck shell=sh
# The host baseline (sparkrig/baseline.py Baseline, also inside status.py's read and init's
# probe): key=value lines, then the end marker. $1 the fabric interface, $2 its RDMA device (""
# when not known), $3 the GRUB menu update-grub writes.
# One shell, file reads by its own ``read`` (no process), then grep and dpkg-query. The kernel
# release is read from /proc/sys/kernel/osrelease (what uname -r prints); the lab fakes a rank's
# release by bind-mounting a file over it, which only this read sees (docs/baseline.md).
k=; read -r k < /proc/sys/kernel/osrelease; echo "kernel=$k"
v=; read -r v < /proc/cmdline; echo "cmdline=$v"
f=/sys/module/nvidia/version; if [ -r $f ]; then read -r v < $f; echo "driver_module=$v"; fi
f=/proc/driver/nvidia/version; if [ -r $f ]; then read -r v < $f; echo "driver_proc=$v"; fi
for f in "/sys/class/net/$1"/device/infiniband/*/fw_ver ${2:+"/sys/class/infiniband/$2/fw_ver"}; do
  if [ -r "$f" ]; then read -r v < "$f"; echo "nic_fw=$v"; break; fi
done
for x in bios_vendor bios_version bios_date sys_vendor product_name board_name; do
  v=; [ -r /sys/class/dmi/id/$x ] && read -r v < /sys/class/dmi/id/$x; echo "dmi_$x=$v"
done
grep -sE '^CONFIG_KEXEC_HANDOVER(_ENABLE_DEFAULT)?=' "/boot/config-$k"
grep -qs '[[:space:]]kho=off' "$3" && echo "grub_kho=1"
dpkg-query -W -f='pkg=${db:Status-Abbrev}|${Package}|${Version}\n' 'linux-*' '*nvidia*' \
  docker-ce docker.io 2>/dev/null
echo '##SPARKRIG-END##'
