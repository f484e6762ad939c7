"""sparkhost: the programs sparkrig ships to every rank (Python 3 standard library only).

One module per job, run on a host as ``/usr/bin/python3 <install_dir>/lib/sparkhost JOB ARGS``
(``__main__.py`` lists the jobs), and the shared pieces the control side (sparkrig/) imports
instead of keeping copies: ``tokenfile`` (secret files), ``lockfile`` (lockfile validation),
``gid`` (the RoCE v2 GID of an IPv4 address), ``rankenv`` (the rank unit's env
files: rank.env and the start gate's gid.env), ``units`` (systemd: transient units, unit state).

Every module imports only the standard library and ``sparkhost.*`` at its top (no lazy imports;
nccl_smoke imports torch when it runs, in the serving image): a running helper has all of its
code loaded, whatever the deploy replaces under it. A job runs through ``__main__.py`` alone (a
module run as a script would put the package directory itself on ``sys.path``).
"""
