"""Queen's benchmarks: load generator, workloads, servers under test, report.

Speed lives here, never in timed test assertions (STYLE.md). `python -m bench --help` runs it;
README.md beside this file says what each figure means.

Modules:
  workloads.py    the workloads as data, and the bytes each request is
  loadgen.py      closed-loop HTTP/1.1 clients over raw sockets, in pinned processes
  histogram.py    log-bucket latency histogram (HdrHistogram-like)
  servers.py      the servers under test as pinned child processes
  baseline_h11.py a do-nothing trio+h11 server: the per-request ceiling
  sysinfo.py      machine description and CPU accounting from /proc
  profile.py      py-spy on the server, folded into layers
  report.py       results.json and its Markdown rendering
  __main__.py     the command line that runs a session
"""
