"""Queen's benchmarks: load generator, workloads, servers under test, report.

Speed lives here, never in timed test assertions. `python -m bench --help` runs it;
README.md beside this file says what each figure means.

Modules:
  workloads.py    the workloads as data: unit, and per system the session or Go workload
  sessions.py     per-connection request builders (HTTP for Queen, RESP for Redis) that read answers
  queue_sessions.py  the queue workloads' sessions for Queen and Redis Streams, and their setup
  loadgen.py      closed-loop clients over raw sockets, in pinned processes
  diskprobe.py    the data disk's fsync rate, measured at the start of a session
  chart.py        chart.png (matplotlib)
  combine.py      one report from several sessions
  peers/          install.sh, the Go loader (peerload/: etcd, PostgreSQL, NATS, queue latency) and its driver (loader.py)
  histogram.py    log-bucket latency histogram (HdrHistogram-like)
  servers.py      the servers under test (Queen, baseline, Redis, etcd, PostgreSQL, NATS) as pinned child processes
  baseline_http.py a do-nothing server on Queen's HTTP layer: the per-request ceiling
  sysinfo.py      machine description and CPU accounting from /proc
  profile.py      py-spy on the server, folded into layers
  report.py       results.json and its Markdown rendering
  __main__.py     the command line that runs a session
"""
