"""PostgreSQL rows of the benchmark (issue 7): state-only CreateCheckpoint throughput, and
ListCheckpoints latency on one plan holding 100k checkpoints (keyset pagination on the
unique (plan_id, sequence) index), through a real ``checkpointd serve`` over gRPC.

    .venv/bin/python tests/bench/bench_postgres.py
    .venv/bin/python -m tests.bench.bench_postgres --checkpoints 100000 --creates 2000 --store db
    .venv/bin/python tests/bench/bench_postgres.py --engines postgresql,sqlite --fill grpc

Each engine gets a fresh database (PostgreSQL: checkpointd_bench_<random>, dropped at the
end). The plan is filled to --checkpoints with the gRPC creates measured, then (--fill sql,
the default) topped up with rows inserted by SQL in the shape the server writes, or (--fill
grpc) entirely through CreateCheckpoint. Every list result is checked: pages are newest
first, gap-free and the walk sees every checkpoint exactly once. Prints a table and writes
bench-results/bench-postgres-<UTC time>.json. Exit status 1 when a result was wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from concurrent import futures  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

import grpc  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from ulid import ULID  # noqa: E402

from checkpoint.v1 import checkpoint_service_pb2 as pb  # noqa: E402
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc  # noqa: E402
from tests.bench.measure import percentile  # noqa: E402
from tests.conftest import DEFAULT_POSTGRES_URL, PostgresDatabases, RunningServer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("postgresql", "sqlite")
FILLS = ("sql", "grpc")
PAGE_SIZE = 100
STATE_BYTES = 256
CLIENT_THREADS = 8


def log(message: str) -> None:
    print(f"[bench-postgres {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Row:
    engine: str
    metric: str
    value: float
    unit: str
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)


def latency_rows(engine: str, metric: str, samples: list[float], **detail: object) -> list[Row]:
    millis = [s * 1000 for s in samples]
    return [Row(engine, f"{metric} p50", statistics.median(millis), "ms", {"samples": len(millis), **detail}),
            Row(engine, f"{metric} p99", percentile(millis, 0.99), "ms", {"samples": len(millis), **detail})]


@contextmanager
def database_for(engine: str, server_url: str, base: Path) -> Iterator[str]:
    if engine == "sqlite":
        yield f"sqlite:///{base / 'bench.db'}"
        return
    databases = PostgresDatabases(server_url)
    problem = databases.reachable()
    if problem:
        raise SystemExit(f"PostgreSQL is not reachable at {server_url}: {problem}")
    url = databases.create()
    try:
        yield url
    finally:
        databases.close()


def create_throughput(engine: str, stub, plan_id: str, count: int, result: Result) -> None:
    """Sequential creates on one plan (each waits for the previous: the per-plan critical
    section), then CLIENT_THREADS clients on a plan each."""
    latencies = []
    started = time.perf_counter()
    for n in range(count):
        began = time.perf_counter()
        reply = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=plan_id, state=n.to_bytes(8, "big") * (STATE_BYTES // 8), labels={"n": str(n % 10)}))
        latencies.append(time.perf_counter() - began)
        if reply.checkpoint.sequence != n + 1:
            result.wrong.append(f"create {n}: sequence {reply.checkpoint.sequence}, expected {n + 1}")
    elapsed = time.perf_counter() - started
    result.rows.append(Row(engine, "create state-only, 1 client, one plan", count / elapsed, "creates/s",
                           {"creates": count, "seconds": round(elapsed, 3)}))
    result.rows.extend(latency_rows(engine, "create state-only latency, 1 client", latencies))

    plans = [str(ULID()) for _ in range(CLIENT_THREADS)]
    per_client = max(1, count // CLIENT_THREADS)

    def client(plan: str) -> None:
        for _ in range(per_client):
            stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan, state=os.urandom(STATE_BYTES)))

    started = time.perf_counter()
    with futures.ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(client, plans))
    elapsed = time.perf_counter() - started
    total = per_client * CLIENT_THREADS
    result.rows.append(Row(engine, f"create state-only, {CLIENT_THREADS} clients, a plan each", total / elapsed,
                           "creates/s", {"creates": total, "seconds": round(elapsed, 3)}))


def fill_with_sql(url: str, plan_id: str, target: int) -> None:
    """Top the plan up to ``target`` checkpoints with rows shaped like the server's own."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            start = connection.execute(text("SELECT last_sequence FROM plans WHERE plan_id = :p"),
                                       {"p": plan_id}).scalar_one()
            template = connection.execute(text("SELECT phase, trigger, state_digest, state_size_bytes FROM checkpoints "
                                               "WHERE plan_id = :p ORDER BY sequence DESC LIMIT 1"),
                                          {"p": plan_id}).one()
            rows = []
            now = datetime.now(UTC)
            for sequence in range(start + 1, target + 1):
                rows.append({"id": str(ULID()), "plan": plan_id, "seq": sequence, "phase": template.phase,
                             "trigger": template.trigger, "labels": json.dumps({"n": str(sequence % 10)}),
                             "now": now, "digest": template.state_digest, "size": template.state_size_bytes})
                if len(rows) == 5000 or sequence == target:
                    connection.execute(text(
                        "INSERT INTO checkpoints (checkpoint_id, plan_id, sequence, phase, trigger, source_tool, "
                        "description, labels, create_time, file_count, total_size_bytes, state_digest, "
                        "state_size_bytes, skipped, ignore_patterns, excluded_paths) VALUES (:id, :plan, :seq, "
                        ":phase, :trigger, '', '', :labels, :now, 0, 0, :digest, :size, '[]', '[]', '[]')"), rows)
                    rows = []
            connection.execute(text("UPDATE plans SET last_sequence = :n WHERE plan_id = :p"),
                               {"n": target, "p": plan_id})
            if url.startswith("postgresql"):
                connection.execute(text("ANALYZE checkpoints"))
    finally:
        engine.dispose()


def fill_with_grpc(stub, plan_id: str, have: int, target: int) -> None:
    def create(n: int) -> None:
        stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"fill %d" % n,
                                                         labels={"n": str(n % 10)}))

    for n in range(have, target):
        create(n)
        if n % 10000 == 0:
            log(f"  filled {n}/{target}")


def list_latency(engine: str, stub, plan_id: str, total: int, result: Result) -> None:
    def page(token: str = "", filter_text: str = "") -> tuple[pb.ListCheckpointsResponse, float]:
        began = time.perf_counter()
        reply = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=PAGE_SIZE,
                                                               page_token=token, filter=filter_text))
        return reply, time.perf_counter() - began

    first = []
    for _ in range(50):
        reply, seconds = page()
        first.append(seconds)
        if [c.sequence for c in reply.checkpoints] != list(range(total, total - PAGE_SIZE, -1)):
            result.wrong.append("first page is not the newest checkpoints, newest first")
    result.rows.extend(latency_rows(engine, f"list first page ({PAGE_SIZE}) at {total} checkpoints", first))

    walk, seen, token = [], [], ""
    started = time.perf_counter()
    while True:
        reply, seconds = page(token)
        walk.append(seconds)
        seen.extend(c.sequence for c in reply.checkpoints)
        token = reply.next_page_token
        if not token:
            break
    elapsed = time.perf_counter() - started
    if seen != list(range(total, 0, -1)):
        result.wrong.append(f"the keyset walk saw {len(seen)} checkpoints, not {total} newest first, each once")
    result.rows.extend(latency_rows(engine, f"list any page ({PAGE_SIZE}) walking all {total}", walk,
                                    pages=len(walk)))
    result.rows.append(Row(engine, f"list walk of all {total}", elapsed, "s", {"pages": len(walk)}))

    filtered = []
    for _ in range(10):
        reply, seconds = page(filter_text='labels.n = "3"')
        filtered.append(seconds)
        if any(c.labels["n"] != "3" for c in reply.checkpoints) or len(reply.checkpoints) != PAGE_SIZE:
            result.wrong.append("the label filter returned other checkpoints")
    result.rows.extend(latency_rows(engine, f"list first page, label filter, at {total}", filtered))


def explain_list(url: str, plan_id: str) -> str:
    """The database's plan for the list query: the index, not a sort of the plan's rows."""
    if not url.startswith("postgresql"):
        statement = ("EXPLAIN QUERY PLAN SELECT * FROM checkpoints WHERE plan_id = :p AND sequence < :s "
                     "ORDER BY sequence DESC LIMIT 101")
    else:
        statement = ("EXPLAIN SELECT * FROM checkpoints WHERE plan_id = :p AND sequence < :s "
                     "ORDER BY sequence DESC LIMIT 101")
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return "\n".join(" ".join(str(v) for v in row) for row in
                             connection.execute(text(statement), {"p": plan_id, "s": 50000}))
    finally:
        engine.dispose()


def query_latency(engine_name: str, url: str, plan_id: str, total: int, result: Result) -> None:
    """The list query alone, in the database, at random depths: what the index costs, without
    the server's row conversion and gRPC."""
    statement = text("SELECT * FROM checkpoints WHERE plan_id = :p AND sequence < :s "
                     f"ORDER BY sequence DESC LIMIT {PAGE_SIZE + 1}")
    engine = create_engine(url)
    samples = []
    try:
        with engine.connect() as connection:
            for n in range(200):
                before = total - (n * 7919) % total
                began = time.perf_counter()
                rows = connection.execute(statement, {"p": plan_id, "s": before}).all()
                samples.append(time.perf_counter() - began)
                if [r.sequence for r in rows] != list(range(before - 1, max(0, before - 2 - PAGE_SIZE), -1)):
                    result.wrong.append(f"{engine_name}: the list query below {before} returned other rows")
        if url.startswith("postgresql"):
            inside = []
            with engine.connect() as connection:
                for n in range(50):
                    before = total - (n * 7919) % total
                    plan = connection.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM checkpoints WHERE "
                                                   "plan_id = :p AND sequence < :s ORDER BY sequence DESC "
                                                   f"LIMIT {PAGE_SIZE + 1}"), {"p": plan_id, "s": before}).scalar()
                    inside.append(plan[0]["Execution Time"] / 1000)
            result.rows.extend(latency_rows(engine_name, f"list query executing inside PostgreSQL, random page of "
                                                         f"{total}", inside))
    finally:
        engine.dispose()
    result.rows.extend(latency_rows(engine_name, f"list query + driver decoding, random page of {total}", samples))


def bench_engine(engine: str, args: argparse.Namespace, base: Path, result: Result) -> None:
    with database_for(engine, args.postgres_url, base) as url:
        server = RunningServer(base / engine, db_url=url, extra_args=("--store", args.store))
        server.start()
        try:
            with grpc.insecure_channel(server.tcp_target) as channel:
                stub = pb_grpc.CheckpointServiceStub(channel)
                plan_id = str(ULID())
                log(f"{engine}: {args.creates} state-only creates")
                create_throughput(engine, stub, plan_id, args.creates, result)
                log(f"{engine}: filling the plan to {args.checkpoints} checkpoints ({args.fill})")
                if args.fill == "sql":
                    fill_with_sql(url, plan_id, args.checkpoints)
                else:
                    fill_with_grpc(stub, plan_id, args.creates, args.checkpoints)
                plan = explain_list(url, plan_id)
                indexed = "uq_checkpoints_plan_sequence" in plan or "sqlite_autoindex_checkpoints" in plan
                if not indexed:
                    result.wrong.append(f"{engine}: the list query does not use the (plan_id, sequence) index:\n{plan}")
                result.rows.append(Row(engine, "list query uses the (plan_id, sequence) index", float(indexed),
                                       "bool", {"plan": plan}))
                log(f"{engine}: list latency")
                list_latency(engine, stub, plan_id, args.checkpoints, result)
                query_latency(engine, url, plan_id, args.checkpoints, result)
        finally:
            server.stop()


def print_table(result: Result, args: argparse.Namespace) -> None:
    print(f"\ncheckpointd on PostgreSQL: state-only creates and ListCheckpoints at {args.checkpoints} checkpoints "
          f"(store={args.store}, fill={args.fill}, page size {PAGE_SIZE})")
    print(f"{'engine':<11} {'metric':<70} {'value':>12}  unit")
    for row in result.rows:
        value = f"{row.value:.3f}" if row.unit != "bool" else ("yes" if row.value else "NO")
        print(f"{row.engine:<11} {row.metric:<70} {value:>12}  {row.unit}")
    for wrong in result.wrong:
        print(f"WRONG: {wrong}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--engines", default="postgresql",
                        help=f"comma-separated, of: {', '.join(ENGINES)}")
    parser.add_argument("--postgres-url", default=os.environ.get("CHECKPOINTD_TEST_DB_URL") or DEFAULT_POSTGRES_URL,
                        help="PostgreSQL server to create the benchmark database on (env CHECKPOINTD_TEST_DB_URL)")
    parser.add_argument("--store", choices=("db", "disk"), default="db", help="content store of the server")
    parser.add_argument("--checkpoints", type=int, default=100_000, help="checkpoints in the listed plan")
    parser.add_argument("--creates", type=int, default=2000, help="state-only creates measured (at most --checkpoints)")
    parser.add_argument("--fill", choices=FILLS, default="sql", help="how the plan is topped up to --checkpoints")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "bench-results")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(ENGINES)}")
    if not PAGE_SIZE <= args.creates <= args.checkpoints:
        parser.error(f"need {PAGE_SIZE} <= --creates <= --checkpoints")

    result = Result()
    base = Path(tempfile.mkdtemp(prefix="cpdpg-", dir="/tmp"))
    try:
        for engine in engines:
            bench_engine(engine, args, base, result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_table(result, args)
    args.output.mkdir(parents=True, exist_ok=True)
    out = args.output / f"bench-postgres-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps({"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                               "settings": {k: str(v) for k, v in vars(args).items()},
                               "rows": [asdict(r) for r in result.rows], "wrong": result.wrong}, indent=2))
    log(f"wrote {out}")
    return 1 if result.wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())

