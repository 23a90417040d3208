"""The hosts panel's lab view (issue 33): one line per host when the GPUs do not fit, the fleet's
line above, sorting (s), filtering (/), a host opened (Enter), who holds what (U), and a round
that costs the lines on screen, not the fleet (App.run_test on scripted and simulated rounds)."""

from __future__ import annotations

import time
from typing import Any

from textual.widgets import Input

from gputui.model import units
from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState
from gputui.ui.app import create_app
from gputui.ui.hosts_panel import HostsView
from gputui.ui.lab_panel import LabFilterScreen
from gputui.ui.screens import HelpScreen
from gputui.ui.users_screen import HostScreen, UsersScreen, UsersTable
from tests.dashboard_support import Clock, drive, make_backend, screen_text, settled, wait_for
from tests.dashboard_support import utc  # noqa: F401 - an autouse fixture: the screen's clock in UTC
from tests.test_dashboard_processes import Scripted

T0 = Clock().now + 3600.0  # 01:00 UTC: GPU-hours "today" start at midnight, well before
GAP_S = 90.0  # between the two scripted rounds: each held GPU earns 90 s of GPU time
LONG_REASON = "ssh: connect to host down-1 port 22: Connection timed out after 5 s " + "(and much more) " * 8
FLEET_LINE = "80 of 168 GPUs free on 30 hosts; 80 busy; 8 unreachable"


def card(index: int, util: float | None, mem: float | None, user: str | None = None, pid: int = 0) -> GpuSample:
    procs = (GpuProcess(pid, f"python train.py --gpu {index}", user, mem, None, 50.0, 900.0, 60.0),) if user else ()
    return GpuSample(index, name="NVIDIA A100-SXM4-80GB", util_pct=util, mem_used_mib=mem,
                     mem_total_mib=None if mem is None else 81559.0, temperature_c=40.0, power_w=100.0,
                     power_limit_w=400.0, processes=procs)


def node(i: int, when: float) -> HostSnapshot:
    """Host node-NN: i % 4 == 0 four free GPUs; 1 alice on GPUs 0-1 (two free); 2 bob on all four;
    3 carol on GPU 0, GPU 1 says nothing (n/a), two free."""
    pid = 1000 + 10 * i
    kind = i % 4
    if kind == 0:
        gpus = [card(g, 0.0, 0.0) for g in range(4)]
    elif kind == 1:
        gpus = [card(0, 90.0, 40000.0, "alice", pid), card(1, 90.0, 40000.0, "alice", pid + 1),
                card(2, 0.0, 0.0), card(3, 0.0, 0.0)]
    elif kind == 2:
        gpus = [card(g, 50.0, 15000.0, "bob", pid + g) for g in range(4)]
    else:
        gpus = [card(0, 100.0, 70000.0, "carol", pid), card(1, None, None), card(2, 0.0, 0.0), card(3, 0.0, 0.0)]
    return HostSnapshot(f"node-{i:02d}", HostState.OK, when, kind="ssh", cpu_pct=10.0, mem_used_mib=1000.0,
                        mem_total_mib=64000.0, gpus=tuple(gpus))


def fleet(when: float, down: bool) -> list[HostSnapshot]:
    """40 hosts x 4 GPUs, and down-1, down-2 (4 GPUs each, listed after node-19) that stop answering."""
    hosts = [node(i, when) for i in range(40)]
    for name in ("down-1", "down-2"):
        if down:
            reason = LONG_REASON if name == "down-1" else "connection refused"
            extra = HostSnapshot(name, HostState.UNREACHABLE, when, kind="ssh", message=reason)
        else:
            extra = HostSnapshot(name, HostState.OK, when, kind="ssh", gpus=tuple(card(g, 0.0, 0.0) for g in range(4)))
        hosts.insert(20 + int(name[-1]) - 1, extra)
    return hosts


def lab_app(clock: Clock | None = None, interval: float = 0.2) -> Any:
    source = Scripted([fleet(T0, down=False), fleet(T0 + GAP_S, down=True)])
    return create_app(make_backend(demo=False, source=source, clock=clock or Clock(), interval=interval))


async def lab_ready(pilot: Any) -> HostsView:
    app = pilot.app
    view = app.query_one(HostsView)
    await wait_for(pilot, lambda: app.hosts_polls >= 2 and view.lab and FLEET_LINE in screen_text(app),
                   what="the second round in the lab view")
    return view


def names(view: HostsView) -> list[str]:
    return [row.name for row in view.lab_rows]


def test_the_lab_view_shows_at_256x8_and_not_at_2x4() -> None:
    def mode(hosts: int, gpus: int) -> tuple[bool, str]:
        app = create_app(make_backend(sim_hosts=hosts, sim_gpus=gpus, interval=0.2))

        async def scenario(pilot: Any) -> tuple[bool, str]:
            view = app.query_one(HostsView)
            await wait_for(pilot, lambda: app.hosts_polls >= 1 and view.frame is not None, what="a round")
            await wait_for(pilot, lambda: not view.lab or "s Sort" in screen_text(app), what="the lab keys in the footer")
            return view.lab, screen_text(app)

        return drive(app, scenario)

    big, big_text = mode(256, 8)
    assert big and "of 2,048 GPUs free on" in big_text and "s Sort" in big_text, big_text
    small, small_text = mode(2, 4)
    assert not small and "sim-1 · 4× A100-SXM4-80GB" in small_text and "of 8 GPUs free" not in small_text, small_text


def test_fleet_line_and_host_lines() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> list[str]:
        view = await lab_ready(pilot)
        return view.text_lines

    lines = drive(app, scenario)
    assert lines[0] == FLEET_LINE
    by_name = {line[2:].split()[0]: line for line in lines[1:]}
    assert by_name["node-00"].split()[2:5] == ["○○○○", "4", "free"], by_name["node-00"]
    assert "▅▅▅▅  0 free" in by_name["node-02"] and "50%" in by_name["node-02"] and "bob 59 GiB" in by_name["node-02"]
    alice = by_name["node-01"]
    assert "██○○" in alice and "2 free" in alice and "alice 78 GiB" in alice, alice
    # A GPU with neither figure is "?" (not free); the host's utilisation is the mean of those that say.
    assert "█?○○" in by_name["node-03"] and "33%" in by_name["node-03"], by_name["node-03"]


def test_unreachable_hosts_say_why_on_one_line_cut_with_an_ellipsis() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> tuple[list[str], int]:
        view = await lab_ready(pilot)
        return view.text_lines, view.scrollable_content_region.width

    lines, width = drive(app, scenario)
    down = [line for line in lines if "down-" in line]
    assert len(down) == 2, down
    assert down[0].startswith("✖ down-1") and "unreachable: ssh: connect to host down-1" in down[0], down[0]
    assert down[0].endswith("…") and len(down[0]) <= width, down[0]
    assert down[1].rstrip().endswith("unreachable: connection refused"), down[1]
    assert all(len(line) <= width for line in lines)


def test_s_cycles_the_order_and_unreachable_hosts_go_last() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> dict[str, list[str]]:
        view = await lab_ready(pilot)
        seen = {view.lab_sort: names(view)}
        for _ in range(4):
            await pilot.press("s")
            seen[view.lab_sort] = names(view)
        await wait_for(pilot, lambda: "sort: name" in screen_text(app), what="the order in the subtitle")
        return seen

    seen = drive(app, scenario)
    assert seen["listed"][19:23] == ["node-19", "down-1", "down-2", "node-20"]
    assert seen["util"][:3] == ["node-02", "node-06", "node-10"]  # bob's hosts: 50% each
    assert seen["free"][:2] == ["node-00", "node-04"]
    assert seen["memory"][:3] == ["node-01", "node-05", "node-09"]  # alice's 80,000 MiB
    assert seen["name"][:2] == ["node-00", "node-01"]
    for order in ("util", "free", "memory", "name"):
        assert seen[order][-2:] == ["down-1", "down-2"], (order, seen[order][-3:])


async def set_filter(pilot: Any, text: str) -> None:
    app = pilot.app
    await pilot.press("slash")
    await wait_for(pilot, lambda: isinstance(app.screen, LabFilterScreen), what="the filter question")
    app.screen.query_one(Input).value = text
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, LabFilterScreen), what="the filter applied")


def test_the_filter_keeps_a_users_hosts_free_ones_and_words() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> dict[str, Any]:
        view = await lab_ready(pilot)
        out: dict[str, Any] = {}
        for text in ("user:carol", "free", "down", "user:carol node-1", ""):
            await set_filter(pilot, text)
            out[text] = (names(view), screen_text(app))
        return out

    out = drive(app, scenario)
    assert out["user:carol"][0] == [f"node-{i:02d}" for i in range(3, 40, 4)]
    assert "filter: user:carol (10 of 42)" in out["user:carol"][1], out["user:carol"][1]
    assert len(out["free"][0]) == 30 and "node-02" not in out["free"][0] and "down-1" not in out["free"][0]
    assert out["down"][0] == ["down-1", "down-2"]
    assert out["user:carol node-1"][0] == ["node-11", "node-15", "node-19"]
    assert len(out[""][0]) == 42 and "filter:" not in out[""][1]


def test_enter_opens_the_selected_host_and_esc_comes_back() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> tuple[str, str, str]:
        view = await lab_ready(pilot)
        await pilot.press("down", "down")
        chosen = view.selected
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, HostScreen) and "python train.py" in screen_text(app),
                       what="the host screen with its processes")
        text = screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.screen_stack[0], what="back on the dashboard")
        return str(chosen), text, screen_text(app)

    chosen, text, back = drive(app, scenario)
    assert chosen == "node-02"
    assert "Host node-02" in text and "node-02 · 4× A100-SXM4-80GB" in text
    assert text.count("python train.py --gpu") == 4 and "bob" in text and "node-03" not in text, text
    assert FLEET_LINE in back


def test_u_shows_who_holds_what_with_the_rounds_figures() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> tuple[list[list[str]], str]:
        await lab_ready(pilot)
        await pilot.press("U")
        await wait_for(pilot, lambda: isinstance(app.screen, UsersScreen) and app.screen.query_one(UsersTable).row_count,
                       what="the users screen with its rows")
        table = app.screen.query_one(UsersTable)
        rows = [[str(cell).strip() for cell in table.get_row_at(i)] for i in range(table.row_count)]
        text = screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.screen_stack[0], what="back on the dashboard")
        return rows, text

    rows, text = drive(app, scenario)
    # 10 hosts each: alice 2 GPUs x 40,000 MiB, carol 1 x 70,000, bob 4 x 15,000; 90 s a GPU between the rounds.
    assert rows == [
        ["alice", "20", units.mib(800000.0), "0.50", "10", "20"],
        ["carol", "10", units.mib(700000.0), "0.25", "10", "10"],
        ["bob", "40", units.mib(600000.0), "1.00", "10", "40"],
    ], rows
    assert FLEET_LINE in text and "3 accounts" in text


def test_u_works_in_the_per_gpu_view_too() -> None:
    app = create_app(make_backend(sim_hosts=2, sim_gpus=2, interval=0.2))

    async def scenario(pilot: Any) -> str:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="a round")
        assert not app.query_one(HostsView).lab
        await pilot.press("U")
        await wait_for(pilot, lambda: isinstance(app.screen, UsersScreen), what="the users screen")
        return screen_text(app)

    text = drive(app, scenario)
    assert "Who holds what" in text and "account" in text


def test_accounts_from_hosts_are_text_not_markup() -> None:
    hostile = "[bold red]eve[/]"
    source = Scripted([[HostSnapshot(f"h{i}", HostState.OK, T0, kind="ssh", gpus=tuple(
        card(g, 99.0, 50000.0, hostile, 10 * i + g) for g in range(8))) for i in range(12)]])
    app = create_app(make_backend(demo=False, source=source, clock=Clock(), interval=0.2))

    async def scenario(pilot: Any) -> tuple[str, str]:
        view = app.query_one(HostsView)
        await wait_for(pilot, lambda: view.lab and view.frame is not None, what="the lab view")
        lab = screen_text(app)
        await pilot.press("U")
        await wait_for(pilot, lambda: isinstance(app.screen, UsersScreen) and hostile in screen_text(app),
                       what="the account on the users screen, as it came")
        return lab, screen_text(app)

    lab, users = drive(app, scenario)
    assert "[bold red]eve" in lab and hostile in users


def test_sizes_80x24_and_200x50_keep_lines_within_the_panel() -> None:
    for size in ((80, 24), (200, 50)):
        app = lab_app()

        async def scenario(pilot: Any) -> tuple[list[str], int, str]:
            view = await lab_ready(pilot)
            await pilot.pause()
            return view.text_lines, view.scrollable_content_region.width, screen_text(app)

        lines, width, text = drive(app, scenario, size=size)
        assert all(len(line) <= width for line in lines), (size, [ln for ln in lines if len(ln) > width])
        assert "node-00" in text and "Enter Open" in text, (size, text)
        # The fleet line whole (wrapped onto a second line where the panel is narrow).
        assert FLEET_LINE.replace(" ", "") in "".join(lines[:2]).replace(" ", ""), (size, lines[:2])


def test_a_round_builds_only_the_lines_on_screen_and_reuses_unchanged_ones() -> None:
    clock = Clock()
    app = create_app(make_backend(sim_hosts=256, sim_gpus=8, interval=3600, clock=clock))

    async def scenario(pilot: Any) -> tuple[int, int, int, int]:
        view = app.query_one(HostsView)
        await wait_for(pilot, lambda: view.lab and view.frame is not None, what="the lab view")
        for _ in range(50):  # on a busy machine the layout can settle a frame later: a new size builds anew
            await pilot.pause()
            first, size = view.built, view.scrollable_content_region.size
            frame = view.frame
            view.on_resize()  # a late resize of the same size, and no frame before the next round:
            view.frame = None  # the same round again (a new object, the same lines): nothing to build
            view.frame = frame
            await pilot.pause()
            again = view.built
            if view.scrollable_content_region.size == size:
                break
        app.poll_hosts()
        await wait_for(pilot, lambda: app.hosts_polls >= 2, what="a second round")
        await pilot.pause()
        return first, again, view.built, view.scrollable_content_region.height

    first, again, after, height = drive(app, scenario)
    # A screen or two (the layout may settle once more on a busy machine, a width or a height
    # later), never the 256 hosts.
    assert 0 < first <= 4 * height < 256, (first, height)
    assert again == first, (first, again)
    assert after - again <= height, (again, after, height)


def test_a_pass_over_the_lab_reads_the_width_and_base_style_once() -> None:
    """A screen of lab lines drawn in one compositor pass reads the panel's content region and
    base style once (each costs Textual a map lookup or a walk of the ancestors' styles; read
    per line, they were a third of a frame), and every line still gets them."""
    from textual.widget import Widget

    app = create_app(make_backend(sim_hosts=64, sim_gpus=8, interval=3600, clock=Clock()))
    reads = {"region": 0, "style": 0}
    region, style = Widget.scrollable_content_region, Widget.rich_style

    def counted(name: str, prop: Any) -> property:
        def get(widget: Any) -> Any:
            if isinstance(widget, HostsView):
                reads[name] += 1
            return prop.fget(widget)

        return property(get)

    async def scenario(pilot: Any) -> tuple[int, int, int]:
        view = app.query_one(HostsView)
        await wait_for(pilot, lambda: view.lab and view.frame is not None, what="the lab view")
        await pilot.pause()
        Widget.scrollable_content_region = counted("region", region)  # type: ignore[assignment,method-assign]
        Widget.rich_style = counted("style", style)  # type: ignore[assignment,method-assign]
        try:
            lines = view.render_lines(view.region.reset_offset)
        finally:
            Widget.scrollable_content_region, Widget.rich_style = region, style  # type: ignore[misc]
        names = [row.name for row in view.lab_rows[:5]]
        drawn = "\n".join(line.text for line in lines)
        assert len(lines) == view.region.height and all(name in drawn for name in names), drawn
        return len(lines), reads["region"], reads["style"]

    lines, region_reads, style_reads = drive(app, scenario)
    assert lines >= 10
    assert (region_reads, style_reads) == (1, 1), (region_reads, style_reads)


def test_the_help_lists_the_lab_keys() -> None:
    app = lab_app()

    async def scenario(pilot: Any) -> str:
        await lab_ready(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.press("end")
        await pilot.pause()
        return screen_text(app)

    text = drive(app, scenario, size=(120, 60))
    assert "lab view" in text and "Who holds what" in text, text


def test_a_round_repaints_only_the_host_lines_whose_content_changed() -> None:
    """node-03's first GPU drops from 100% to 40% between two rounds and nothing else changes
    (the time aside): the round redraws node-03's line alone, and the screen shows its new mean."""
    from dataclasses import replace

    before, after = fleet(T0, down=False), fleet(T0 + GAP_S, down=False)
    i = next(k for k, h in enumerate(after) if h.name == "node-03")
    after[i] = replace(after[i], gpus=(replace(after[i].gpus[0], util_pct=40.0),) + after[i].gpus[1:])
    app = create_app(make_backend(demo=False, source=Scripted([before, after]), clock=Clock(), interval=3600))

    async def scenario(pilot: Any) -> tuple[list[int], list[str], str]:
        view = app.query_one(HostsView)
        await wait_for(pilot, lambda: view.lab and "● node-03" in screen_text(app), what="the first round in the lab view")
        await settled(pilot, what="the first round drawn")
        drawn: list[int] = []
        draw = view.render_line
        view.render_line = lambda y: (drawn.append(y), draw(y))[1]  # type: ignore[method-assign]
        app.poll_hosts()
        await wait_for(pilot, lambda: app.hosts_polls >= 2, what="the second round")
        text = await settled(pilot, lambda: " 13%" in screen_text(app), what="node-03's new mean on the screen")
        return drawn, view.text_lines, text

    drawn, lines, text = drive(app, scenario)
    y = next(k for k, line in enumerate(lines) if line.startswith("● node-03 "))  # scrolled to the top: screen line y
    assert drawn and set(drawn) == {y}, (drawn, y)
    assert " 33%" not in [line for line in text.splitlines() if "node-03" in line][0]  # (100 + 0 + 0) / 3 before
