"""A constructed recording: two Mac minis behind one Thunderbolt hub on a Mac Studio's port.

Built from the `peer-behind-hub` fixture (hub-studio with an OWC Thunderbolt 5 hub on en2,
hub-mini on the hub) by adding `hub-mini-2`, a copy of hub-mini with its own domain UUIDs,
on the hub's second downstream port. As in that fixture, the upstream Mac sees the hub
with both Macs nested in its `_items`; each mini sees hub-studio's port at its first level
(and not the other mini: Thunderbolt networking is between neighbouring domains only).
With `direct=True` the minis are also cabled to each other (en3 <-> en3), making a ring.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from pathlib import Path

from tb_fixtures import FIXTURES

SOURCE = FIXTURES / "peer-behind-hub"
HOSTS = ["hub-studio", "hub-mini", "hub-mini-2"]


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _dump(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, separators=(",", " : ")) + "\n")


def _bus(data: dict, name: str) -> dict:
    return next(b for b in data["SPThunderboltDataType"] if b["_name"] == name)


def _peer_item(uuid_: str, name: str, model: str) -> dict:
    return {"_name": name, "device_id_key": "0xA", "device_name_key": model, "domain_uuid_key": uuid_,
            "vendor_id_key": "0x0A27", "vendor_name_key": "Apple Inc.",
            "services_title": [{"_name": "service_ip", "protocol_id_key": 1, "protocol_revision_key": 1,
                                "protocol_version_key": 1, "service_uuid_key": str(uuid.uuid5(uuid.NAMESPACE_URL, uuid_)).upper()}]}


def _connect(bus: dict, peer: dict, speed: str = "80 Gb/s") -> None:
    bus["_items"] = [peer]
    bus["receptacle_1_tag"].update(current_speed_key=speed, link_status_key="0x2", micro_version_key="0.0.0",
                                   receptacle_status_key="receptacle_connected")


def two_macs_behind_hub(dst: Path, direct: bool = False) -> Path:
    """Write the recording to `dst` (a new folder) and return it."""
    shutil.copytree(SOURCE, dst)
    (dst / "expected.json").unlink()  # it describes the two-host cabling
    shutil.copytree(dst / "hub-mini", dst / "hub-mini-2")
    (dst / "hub-mini-2" / "en0.txt").write_text("10.0.0.73\n")
    (dst / "hosts.txt").write_text("\n".join(HOSTS) + "\n")

    mini = _load(dst / "hub-mini" / "system_profiler.json")
    mini2 = copy.deepcopy(mini)
    for b in mini2["SPThunderboltDataType"]:  # own buses get new UUIDs; the peer (hub-studio) stays
        b["domain_uuid_key"] = str(uuid.uuid5(uuid.NAMESPACE_DNS, "hub-mini-2/" + b["_name"])).upper()
        b["switch_uid_key"] = "0x05AC" + b["domain_uuid_key"].replace("-", "")[:12]

    studio = _load(dst / "hub-studio" / "system_profiler.json")
    hub = _bus(studio, "thunderboltusb4_bus_0")["_items"][0]
    hub["_items"].append(_peer_item(_bus(mini2, "thunderboltusb4_bus_0")["domain_uuid_key"], "Mac mini", "Mac16,11"))
    hub["receptacle_3_tag"].update(current_speed_key="80 Gb/s", link_status_key="0x2",
                                   receptacle_status_key="receptacle_connected")
    if direct:  # Thunderbolt 2 (en3) of each mini to the other's
        a, b = _bus(mini, "thunderboltusb4_bus_1"), _bus(mini2, "thunderboltusb4_bus_1")
        _connect(a, _peer_item(b["domain_uuid_key"], "Mac mini", "Mac16,11"))
        _connect(b, _peer_item(a["domain_uuid_key"], "Mac mini", "Mac16,11"))
    _dump(dst / "hub-studio" / "system_profiler.json", studio)
    _dump(dst / "hub-mini" / "system_profiler.json", mini)
    _dump(dst / "hub-mini-2" / "system_profiler.json", mini2)
    return dst
