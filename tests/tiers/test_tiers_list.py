"""TierModel.tiers: the tiers as a list (GPU, host, then disk when the engine has one), for sinks that draw N tiers."""

from __future__ import annotations

from kvtop.records import Record, make
from kvtop.tiers import TierModel, TierState


def _meta(**data: object) -> Record:
    return make("meta", {"engine": "tensorrt_llm", **data}, time=1.0)


def test_two_tiers_without_disk_in_order_with_labels() -> None:
    m = TierModel()
    m.apply(_meta(primary_blocks=100, secondary_blocks=40, bytes_per_block=2048, tokens_per_block=32))
    tiers = m.tiers
    assert [t.name for t in tiers] == ["gpu", "host"]
    assert [t.label for t in tiers] == ["GPU", "Host"]
    assert tiers[0] == m.gpu and tiers[1] == m.host
    assert tiers[0].capacity_blocks == 100 and tiers[1].capacity_bytes == 40 * 2048
    assert list(m.summary()["tiers"]) == ["gpu", "host"]


def test_a_disk_pool_adds_a_third_tier_everywhere() -> None:
    m = TierModel()
    m.apply(_meta(primary_blocks=100, secondary_blocks=40, disk_blocks=1000, bytes_per_block=2048, tokens_per_block=32))
    names = [t.name for t in m.tiers]
    assert names == ["gpu", "host", "disk"]
    disk = m.tiers[2]
    assert disk.label == "Disk" and disk.capacity_blocks == 1000 and disk.capacity_bytes == 1000 * 2048
    assert disk.capacity_tokens == 32000
    summary = m.summary()["tiers"]
    assert list(summary) == ["gpu", "host", "disk"]
    assert summary["disk"]["capacity_bytes"] == 2048000


def test_host_tier_stays_listed_at_zero_blocks() -> None:
    m = TierModel()
    m.apply(_meta(primary_blocks=10, secondary_blocks=0))
    assert [t.name for t in m.tiers] == ["gpu", "host"]
    assert m.tiers[1].capacity_blocks == 0


def test_unknown_tier_name_labels_as_itself() -> None:
    assert TierState("nvme0", 1, None, None, None).label == "nvme0"
