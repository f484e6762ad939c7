# shellcheck shell=sh
# The firewall's state (sparkrig/firewall.py FirewallState): whether nft is installed and the
# table $1 $2 ("inet sparkrig") is loaded, then the end marker.
if command -v nft >/dev/null 2>&1; then
  echo nft=yes
  if nft list table "$1" "$2" >/dev/null 2>&1; then echo table=loaded; else echo table=absent; fi
else
  echo nft=missing
fi
echo '##SPARKRIG-END##'
