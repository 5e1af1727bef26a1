"""The kernel server (issue 29): a process per venv that has done a kernel's start-up once, and
forks a fresh kernel from it for each ipykernel launch that ``run`` hands it.

Modules, one concept each: :mod:`places` (the server's directory, socket and lock),
:mod:`protocol` (the messages on the socket), :mod:`key` (what the server serves, and when that is
no longer current), :mod:`template` and :mod:`loop` (the server, in the venv's interpreter),
:mod:`child` (what a forked kernel does before ipykernel runs), :mod:`client` (the stand-in ``run``
becomes), :mod:`standin` (what it does until the kernel ends), :mod:`spawn` (starting a server in
the background), :mod:`server` (``serve``'s entry), :mod:`handover` (``serve`` when another
server holds the lock), :mod:`title` (what ``ps`` shows of a server and its kernels),
:mod:`info` (``status`` and ``gc``), :mod:`switch` (whether kernels are served at all), and
:mod:`provisioner` (jupyter_client's, loaded only by it) with :mod:`provisioned` (the kernel
it asks the server for).
"""
