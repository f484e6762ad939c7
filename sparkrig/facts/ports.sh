# shellcheck shell=sh
# Who listens on sparkrig's ports (sparkrig/ports.py Listeners): a listen= line per socket, then
# the end marker. $1 the ss filter of those ports: "( sport = :8000 or sport = :29521 )".
# One ``ss`` for every port; each holder's cgroup from /proc by the shell's own read, and a
# container's name from its config (docker writes it on one line), so a read costs one process.
# ``docker inspect`` answers only when that file is not there (another docker data root).
command -v ss >/dev/null 2>&1 || { echo 'ss=missing'; echo '##SPARKRIG-END##'; exit 0; }
ss -Hltnp "$1" 2>/dev/null | while read -r _ _ _ addr _ users; do
  pid=; comm=; cg=; id=; name=
  case $users in *pid=*) pid=${users#*pid=}; pid=${pid%%,*};; esac
  case $users in *'(("'*) comm=${users#*'(("'}; comm=${comm%%'"'*};; esac
  if [ -n "$pid" ] && [ -r "/proc/$pid/cgroup" ]; then
    while IFS= read -r l; do
      case $l in
        0::*) cg=${l#0::};;
        *:name=systemd:*) [ -n "$cg" ] || cg=${l#*:name=systemd:};;
      esac
    done < "/proc/$pid/cgroup"
  fi
  case $cg in
    */docker-*.scope) id=${cg##*/docker-}; id=${id%.scope};;
    */docker/*) id=${cg##*/docker/}; id=${id%%/*};;
  esac
  if [ -n "$id" ]; then
    j=; read -r j 2>/dev/null < "/var/lib/docker/containers/$id/config.v2.json"
    case $j in
      *'"Name":"/'*) name=${j#*'"Name":"/'}; name=${name%%'"'*};;
      *) name=$(timeout 5 docker inspect --format '{{.Name}}' "$id" 2>/dev/null)
         name=${name#/};;
    esac
  fi
  echo "listen=$addr|$pid|$comm|$cg|$name"
done
echo '##SPARKRIG-END##'
