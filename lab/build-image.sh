#!/bin/bash
# The lab's guest image recipe. lab/image.py hashes this file: any change here rebuilds the image.
# Usage: build-image.sh OUTDIR   (as root; writes OUTDIR/{rootfs/,base.qcow2,vmlinuz,initrd.img})
set -euo pipefail
OUT=$1
SUITE=${LAB_SUITE:-trixie}
MIRROR=http://deb.debian.org/debian
ROOT=$OUT/rootfs
PACKAGES="systemd systemd-sysv udev dbus kmod netplan.io network-manager openssh-server sudo
  docker.io docker-cli rdma-core ibverbs-utils perftest python3 python3-requests busybox-static
  iproute2 iputils-ping curl ca-certificates procps linux-image-amd64 initramfs-tools
  nginx nftables"
umask 022
# The chroot's maintainer scripts (debootstrap's second stage's too) must not see the host's
# environment: a TMPDIR naming a folder the image lacks fails their mktemp (openssh-server's).
unset TMPDIR TMP TEMP
in_root() {
  chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive ${http_proxy:+http_proxy=$http_proxy} \
    ${https_proxy:+https_proxy=$https_proxy} "$@"
}

rm -rf "$ROOT"
mkdir -p "$ROOT"
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR"

# no service starts inside the chroot
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"
mount -t proc proc "$ROOT/proc"
trap 'umount "$ROOT/proc" || true' EXIT

# NIC names like a DGX Spark's, fixed by PCI slot (qemu: -device virtio-net-pci,addr=N)
mkdir -p "$ROOT/etc/systemd/network"
link() { printf '[Match]\nPath=pci-0000:00:%s.0\n[Link]\nName=%s\n' "$1" "$2" \
  >"$ROOT/etc/systemd/network/10-$2.link"; }
link 07 enP7s7
link 08 enp1s0f1np1
# `lab up --fabric ports` (lab/fabric.py): both PCIe functions of both QSFP ports
link 0a enp1s0f0np0
link 0b enP2p1s0f0np0
link 0c enP2p1s0f1np1
link 09 enP9s9

echo lab-guest >"$ROOT/etc/hostname"
cat >"$ROOT/etc/fstab" <<'EOF'
/dev/vda / ext4 rw,errors=remount-ro 0 1
EOF
mkdir -p "$ROOT/etc/docker"
cat >"$ROOT/etc/docker/daemon.json" <<'EOF'
{"insecure-registries": ["203.0.113.1:5000"], "dns": ["203.0.113.1"]}
EOF

in_root apt-get update -q
in_root apt-get install -y -q --no-install-recommends \
  $PACKAGES

# unprivileged ping as on DGX OS (libcap2-bin arrived after iputils-ping was configured)
in_root setcap cap_net_raw+ep /usr/bin/ping

# operator account: passwordless sudo, key injected at boot from the kernel command line
in_root useradd -m -s /bin/bash -G sudo,docker spark
echo 'spark ALL=(ALL) NOPASSWD:ALL' >"$ROOT/etc/sudoers.d/spark"
chmod 440 "$ROOT/etc/sudoers.d/spark"
: >"$ROOT/etc/machine-id"
rm -f "$ROOT"/etc/ssh/ssh_host_*
in_root ssh-keygen -A -q   # same host keys on every guest; known_hosts written by the lab
printf 'PasswordAuthentication no\nUseDNS no\n' >"$ROOT/etc/ssh/sshd_config.d/lab.conf"

# per-guest identity from the kernel command line: sparkrig.host= sparkrig.idx= sparkrig.key=
cat >"$ROOT/usr/local/sbin/lab-firstboot" <<'EOF'
#!/bin/sh
# Lab-only: hostname, authorized key and uplink netplan from the kernel command line.
set -e
HOST= IDX= KEY=
umask 022
for kv in $(cat /proc/cmdline); do
  case $kv in
    sparkrig.host=*) HOST=${kv#*=} ;;
    sparkrig.idx=*) IDX=${kv#*=} ;;
    sparkrig.key=*) KEY=${kv#*=} ;;
  esac
done
[ -n "$HOST" ] && { echo "$HOST" >/etc/hostname; echo "$HOST" >/proc/sys/kernel/hostname; \
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$HOST" >/etc/hosts; }
if [ -n "$KEY" ]; then
  install -d -m 700 -o spark -g spark /home/spark/.ssh
  echo "ssh-ed25519 $KEY lab" >/home/spark/.ssh/authorized_keys
  chown spark:spark /home/spark/.ssh/authorized_keys
  chmod 600 /home/spark/.ssh/authorized_keys
fi
if [ -n "$IDX" ] && [ ! -e /etc/netplan/50-lab-uplinks.yaml ]; then
  # the management/SSH link and both uplinks as NetworkManager connections (netplan-rendered, as
  # on DGX OS), with NM's own route metrics: wired 100, Wi-Fi 600 (uplink B stands in for Wi-Fi)
  cat >/etc/netplan/50-lab-uplinks.yaml <<NP
network:
  version: 2
  renderer: NetworkManager
  ethernets:
    enP7s7:
      addresses: [172.30.1.$((10 + IDX))/24]
      routes: [{to: default, via: 172.30.1.1, metric: 100}]
      networkmanager:
        name: "Wired connection 1"
        passthrough:
          ipv4.route-metric: "100"
    enP9s9:
      addresses: [172.30.2.$((10 + IDX))/24]
      routes: [{to: default, via: 172.30.2.1, metric: 600}]
      networkmanager:
        name: "Wi-Fi uplink (stand-in)"
        passthrough:
          ipv4.route-metric: "600"
NP
  chmod 600 /etc/netplan/50-lab-uplinks.yaml
fi
/usr/libexec/netplan/generate
EOF
chmod 755 "$ROOT/usr/local/sbin/lab-firstboot"
cat >"$ROOT/etc/systemd/system/lab-firstboot.service" <<'EOF'
[Unit]
Description=Lab guest identity (hostname, key, uplinks) from the kernel command line
DefaultDependencies=no
After=local-fs.target
Before=NetworkManager.service network-pre.target ssh.service sysinit.target
Wants=network-pre.target
[Service]
Type=oneshot
RemainAfterExit=yes
UMask=0022
ExecStart=/usr/local/sbin/lab-firstboot
[Install]
WantedBy=sysinit.target
EOF

# Soft-RoCE on the fabric NICs (rxe links do not survive reboot); the NICs themselves stay
# unconfigured. Which device on which NIC: the kernel command line's sparkrig.rxe=DEV:NETDEV,...
# (`lab up --fabric ports`: DGX OS's RDMA device names), else rxe0 on enp1s0f1np1.
cat >"$ROOT/usr/local/sbin/lab-rxe" <<'EOF'
#!/bin/sh
set -e
map=rxe0:enp1s0f1np1
for word in $(cat /proc/cmdline); do
  case $word in sparkrig.rxe=*) map=${word#sparkrig.rxe=} ;; esac
done
modprobe rdma_rxe
for pair in $(echo "$map" | tr , ' '); do
  dev=${pair%%:*} netdev=${pair#*:}
  # poll for the renamed NIC rather than bind to its device unit: under TCG on a loaded host
  # udev can take longer than the 90 s device-job timeout, which failed this unit for the boot
  until [ -e "/sys/class/net/$netdev" ]; do sleep 1; done
  ip link set "$netdev" up
  rdma link show "$dev/1" >/dev/null 2>&1 || rdma link add "$dev" type rxe netdev "$netdev"
done
EOF
chmod 755 "$ROOT/usr/local/sbin/lab-rxe"
cat >"$ROOT/etc/systemd/system/lab-rxe.service" <<'EOF'
[Unit]
Description=Lab Soft-RoCE devices on the fabric NICs
After=systemd-udevd.service
Before=network.target
[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec=900
ExecStart=/usr/local/sbin/lab-rxe
[Install]
WantedBy=multi-user.target
EOF

# empty machine-id is not "first boot": make sure sshd has host keys anyway
mkdir -p "$ROOT/etc/systemd/system/ssh.service.d"
printf '[Service]\nExecStartPre=/usr/bin/ssh-keygen -A\n' \
  >"$ROOT/etc/systemd/system/ssh.service.d/lab-hostkeys.conf"

# The DGX OS network stack: NetworkManager renders every interface (netplan's global
# `renderer: NetworkManager`, as Ubuntu desktop images ship it); systemd-networkd is off.
cat >"$ROOT/etc/netplan/01-network-manager-all.yaml" <<'EOF'
# Let NetworkManager manage all devices on this system
network:
  version: 2
  renderer: NetworkManager
EOF
chmod 600 "$ROOT/etc/netplan/01-network-manager-all.yaml"
# Lab choice: no in-memory "Wired connection N" (DHCP) on NICs without a profile, so the fabric NIC
# stays unconfigured until sparkrig configures it (a stock Ubuntu NM would try DHCP on it first).
mkdir -p "$ROOT/etc/NetworkManager/conf.d"
printf '[main]\nno-auto-default=*\n' >"$ROOT/etc/NetworkManager/conf.d/90-lab-no-auto-default.conf"

in_root systemctl enable lab-firstboot.service lab-rxe.service NetworkManager.service \
  ssh.service docker.service
in_root systemctl disable systemd-networkd.service systemd-networkd.socket 2>/dev/null || true
# nginx (the API front) and nftables (sparkrig's firewall) are in the image only because the guests
# have no internet to install them from; as on a fresh DGX OS, neither runs until the deploy says so
in_root systemctl disable nginx.service nftables.service 2>/dev/null || true
in_root systemctl mask systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_reap.service
echo 'root:lab' | in_root chpasswd   # console login only (serial log)

in_root apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT/usr/sbin/policy-rc.d"
# no DNS in the lab (debootstrap copied the build host's resolver): fail fast, never time out
rm -f "$ROOT/etc/resolv.conf"
printf '# sparkrig lab: no DNS\noptions timeout:1 attempts:1\n' >"$ROOT/etc/resolv.conf"
umount "$ROOT/proc"
trap - EXIT

cp -L "$ROOT/vmlinuz" "$OUT/vmlinuz"
cp -L "$ROOT/initrd.img" "$OUT/initrd.img"
rm -f "$OUT/base.raw" "$OUT/base.qcow2"
truncate -s 12G "$OUT/base.raw"
mkfs.ext4 -q -F -L lab-root -d "$ROOT" "$OUT/base.raw"
qemu-img convert -O qcow2 "$OUT/base.raw" "$OUT/base.qcow2"
rm -f "$OUT/base.raw"
cat "$ROOT"/etc/ssh/ssh_host_*_key.pub >"$OUT/host_keys.pub"
echo "$SUITE" >"$OUT/suite"
