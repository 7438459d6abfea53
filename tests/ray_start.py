"""`ray start` for the two-node fixture (conftest.py), with a patient raylet registration: Ray 2.60 gives a
starting node's raylet a fixed 30 s to appear in the GCS (a local in ray/_private/node.py, no setting or
environment variable raises it), and under heavy load on a 2-core machine a node B restarted for a resume missed
it three times in a row. Its loop asks `ray._private.services.get_node` until the node is there or 30 s have
passed; here each ask itself retries for up to REGISTRATION_WAIT_S, so the loop's clock never runs out first.
Nothing else changes: the same CLI, the same processes.

Usage: python ray_start.py start --block ... (the `ray` command's arguments)."""
import sys
import time

import ray._private.services as services
from ray.scripts.scripts import main

REGISTRATION_WAIT_S = 90.0  # below the fixture's START_TIMEOUT_S, which then names a start that is hopeless
_get_node = services.get_node


def patient_get_node(gcs_address, node_id):
    give_up = time.monotonic() + REGISTRATION_WAIT_S
    while True:
        try:
            return _get_node(gcs_address, node_id)
        except RuntimeError:  # "GCS cannot find the node": its raylet has not registered yet
            if time.monotonic() > give_up:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    services.get_node = patient_get_node
    sys.argv[0] = "ray"
    sys.exit(main())
