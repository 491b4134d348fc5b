"""What the suites without a cluster stand in for the data plane with: a
urllib3 response over given lines, and the wire contract's golden streams."""

import pathlib

GOLDEN = pathlib.Path(__file__).resolve().parents[3] / "pkg" / "protocol" / "testdata"


class Stream:
    """An unread urllib3 response: its lines, and ``data`` when read whole."""

    def __init__(self, lines, data=b""):
        self._lines, self.data = lines, data

    def __iter__(self):
        return iter(self._lines)

    def drain_conn(self):
        pass

    def release_conn(self):
        pass
