"""``ninfer supervisor``: owns one ``ninfer serve`` engine (start, stop, restart, crash restart with backoff,
switching between configured presets after a preflight check), watches its health and the GPU memory (NVML),
keeps a memory reserve free, edits its configuration, and serves a browser dashboard of requests, clients and
prefix reuse. docs/supervisor.md describes it.

Modules, one concern each: ``config`` (the file), ``catalog`` (presets: command line and preflight), ``gpu``
(NVML), ``process`` (one engine process and its session), ``lifecycle`` (the control loop), ``activity`` (request
log and metrics samples), ``http`` (API and dashboard), ``systemd`` (the user service), ``cli``.
"""
