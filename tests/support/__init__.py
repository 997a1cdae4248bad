"""What the tests share, imported as plain modules (never from a conftest).

* :mod:`tests.support.hub`: :class:`~tests.support.hub.HubProcess`, the one ``agora serve``
  launcher, and :class:`~tests.support.hub.HubStarter`, which stops what a test started;
* :mod:`tests.support.peer`: raw WebSocket clients (no hub/client.py) and event filters;
* :mod:`tests.support.tokens`: the test secret and capability tokens signed with it;
* :mod:`tests.support.postgres`: the PostgreSQL server of the tests, its probe, a schema per test;
* :mod:`tests.support.docker`: the Docker Engine probe;
* :mod:`tests.support.require`: skip where a service is missing, fail where CI requires it;
* :mod:`tests.support.waiting`: wait for a condition within a generous bound;
* :mod:`tests.support.paths`: where the repository is;
* :mod:`tests.support.a2a`: the A2A door served on ``hub.http``'s listener.

conftest.py files hold only fixtures, built from these modules; a helper used by one directory
only lives beside its tests (tests/backends/rigs.py, tests/hub/log/stores.py, …).
"""
