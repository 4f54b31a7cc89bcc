"""Pins and the heap map from hand-built walks: the figures are added up here by hand."""

from __future__ import annotations

from array import array

from memforensics.analysis.pins import content_kind, heap_map, heap_pins, pin_threshold
from memforensics.model.chunks import ChunkState, HeapChunks
from memforensics.model.pins import ResidentPages

L, F, T, K, TOP, B = (
    ChunkState.LIVE,
    ChunkState.FREE,
    ChunkState.TCACHE,
    ChunkState.FAST,
    ChunkState.TOP,
    ChunkState.BOOKKEEPING,
)
MIB = 1024 * 1024
START = 0x55550000_0000


def build(
    layout: list[tuple[ChunkState, int]], *, arena: int = 0, mapped_end: int | None = None
) -> HeapChunks:
    addresses, sizes, states = array("Q"), array("Q"), bytearray()
    address = START
    for state, size in layout:
        addresses.append(address)
        sizes.append(size)
        states.append(int(state))
        address += size
    return HeapChunks(
        arena=arena,
        heap=0,
        start=START,
        mapped_end=mapped_end or address,
        addresses=addresses,
        sizes=sizes,
        states=bytes(states),
        complete=True,
    )


def all_resident(chunks: HeapChunks) -> ResidentPages:
    pages = -(-(chunks.mapped_end - START) // 4096)
    return ResidentPages(START, 4096, b"\1" * pages)


def test_free_all_but_the_last_buffer_pins_every_freed_byte() -> None:
    # tcache struct, 100 freed 64 KiB buffers merged into one free chunk, the last one live.
    freed = 100 * 0x10010
    chunks = build([(B, 0x290), (F, freed), (L, 0x10010), (TOP, 0x20000)])
    pins = heap_pins(chunks, all_resident(chunks))
    assert len(pins.pins) == 1
    pin = pins.pins[0]
    assert pin.address == START + 0x290 + freed + 16
    assert pin.pinned_free_bytes == freed
    assert pin.resident_bytes == freed
    assert pin.chunk_bytes == 0x10010 and pin.rank == 1
    assert pins.held_free_bytes == freed
    assert pins.top_bytes == 0x20000 and pins.live_bytes == 0x10010


def test_free_all_but_the_first_pins_nothing() -> None:
    chunks = build([(B, 0x290), (L, 0x10010), (TOP, 100 * 0x10010)])
    pins = heap_pins(chunks, all_resident(chunks))
    assert pins.pins == () and pins.held_free_bytes == 0


def test_pins_listed_from_the_top_down_with_small_gaps_left_out() -> None:
    layout = [
        (B, 0x290),
        (F, 3 * MIB),
        (L, 0x400),  # pins 3 MiB
        (F, 0x1000),  # too little to list
        (L, 0x400),
        (T, 0x2000),
        (K, 0x20),
        (F, 2 * MIB - 0x2020),
        (L, 0x1000),  # pins 2 MiB (binned, tcache and fastbin chunks alike)
        (TOP, 0x21000),
    ]
    chunks = build(layout)
    pins = heap_pins(chunks, all_resident(chunks), threshold_bytes=MIB)
    assert [p.pinned_free_bytes for p in pins.pins] == [2 * MIB, 3 * MIB]
    assert [p.rank for p in pins.pins] == [1, 2]
    assert pins.pins[0].address > pins.pins[1].address
    assert pins.held_free_bytes == 5 * MIB + 0x1000
    assert pins.free_bytes == 5 * MIB + 0x1000


def test_resident_bytes_count_only_present_pages() -> None:
    chunks = build([(B, 0x1000), (F, 16 * 4096), (L, 0x1000), (TOP, 0x1000)])
    present = bytearray(b"\1" * 19)
    for page in range(3, 13):  # ten of the free chunk's pages given back by a trim
        present[page] = 0
    pins = heap_pins(chunks, ResidentPages(START, 4096, bytes(present)), threshold_bytes=4096)
    assert pins.pins[0].resident_bytes == 6 * 4096
    unknown = heap_pins(chunks, None, threshold_bytes=4096)
    assert unknown.pins[0].resident_bytes is None


def test_cap_on_listed_pins_counts_the_rest() -> None:
    layout = [(B, 0x290)] + [(F, MIB), (L, 0x100)] * 20 + [(TOP, 0x1000)]
    pins = heap_pins(build(layout), None, threshold_bytes=MIB, max_pins=5)
    assert len(pins.pins) == 5 and pins.pins_omitted == 15


def test_threshold_is_one_mib_or_one_percent() -> None:
    assert pin_threshold(1 << 30) == MIB
    assert pin_threshold(20 * MIB) == 20 * MIB // 100
    assert pin_threshold(MIB) == 64 * 1024


def test_heap_map_cells_add_up_to_the_heap() -> None:
    chunks = build([(B, 0x290), (F, 64 * 4096), (L, 0x1000 - 0x290), (TOP, 31 * 4096)])
    present = bytearray(b"\1" * 96)
    for page in range(10, 40):
        present[page] = 0
    cells = heap_map(chunks, ResidentPages(START, 4096, bytes(present)), max_cells=24)
    assert cells.pages_per_cell == 4 and cells.cells == 24
    total = sum(
        sum(values)
        for values in (cells.live, cells.free_resident, cells.free_released, cells.top, cells.other)
    )
    assert total == chunks.mapped_end - START
    assert sum(cells.free_released) == 30 * 4096
    assert sum(cells.free_resident) == 64 * 4096 - 30 * 4096
    assert sum(cells.live) == 0x1000 - 0x290
    assert sum(cells.top) == 31 * 4096
    assert sum(cells.other) == 0x290
    # The live chunk sits in page 64, i.e. in cell 16.
    assert cells.live[16] == 0x1000 - 0x290


def test_heap_map_of_a_gigabyte_heap_stays_small() -> None:
    chunks = build([(B, 0x290), (F, (1 << 30) - 0x290 - 0x2000), (L, 0x1000), (TOP, 0x1000)])
    cells = heap_map(chunks, None)
    assert cells.cells <= 4096 and cells.pages_per_cell == 64


def test_content_kind() -> None:
    assert content_kind(b"GET /api/v1/items HTTP/1.1\r\n\0\0") == (
        "text",
        "GET /api/v1/items HTTP/1.1\\r\\n",
    )
    assert content_kind(bytes(64)) == ("zeros", None)
    assert content_kind(b"\x01\x02\xff\x00abc")[0] == "binary"
