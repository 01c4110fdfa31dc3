#!/usr/bin/env python3
"""`gradscope export --format perfetto` end to end, read with protobuf's own tools.

Exports synthetic traces (a data-parallel GPU job merged from its rank files; a pipeline job with
point-to-point messages) to Perfetto and to Chrome JSON, inflates the Perfetto file's compressed bundles
(zlib), decodes the packets with `protoc --decode=gradscope.perfetto.Trace storage/src/perfetto_trace.proto`,
replays the sequences (interning, defaults, incremental clocks, begin/end stacks per track) and checks that
every call of the Chrome trace is a slice with the same name, nanosecond start and duration, arguments,
rank and communicator track, and that every message flow is there. Then the refusals: unwritable output,
an empty file, a trace without calls: exit 2, one line, no file.

  check_perfetto_export.py --gradscope BIN --synth BIN --protoc BIN --proto FILE --work DIR
"""

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import zlib

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message, file=sys.stderr)
    return condition


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, **kwargs)


def must(args):
    result = run(args)
    if result.returncode != 0:
        sys.exit(f"check_perfetto_export: {' '.join(args)} failed ({result.returncode}): "
                 f"{result.stderr.decode(errors='replace')}")
    return result


def varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def inflate_bundles(data):
    """The file's packets with each compressed_packets bundle replaced by the packets it holds."""
    out = bytearray()
    at = 0
    while at < len(data):
        packet_start = at
        tag, at = varint(data, at)
        assert tag == (1 << 3) | 2, f"expected Trace.packet, found tag {tag}"
        size, at = varint(data, at)
        packet = data[at:at + size]
        at += size
        inner_tag, inner_at = varint(packet, 0)
        if inner_tag == (50 << 3) | 2:
            inner_size, inner_at = varint(packet, inner_at)
            check(inner_at + inner_size == len(packet), "a compressed bundle carries only compressed_packets")
            check(at - packet_start < 512 * 1024, "a compressed bundle is under 512 KB")
            out += zlib.decompress(packet[inner_at:inner_at + inner_size])
        else:
            out += data[packet_start:at]
    return bytes(out)


def parse_text_format(text):
    """protoc's text output as nested dicts of lists."""
    root = {}
    stack = [root]
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.endswith("{"):
            child = {}
            stack[-1].setdefault(line[:-1].strip(), []).append(child)
            stack.append(child)
        elif line == "}":
            stack.pop()
        else:
            key, value = line.split(": ", 1)
            if value.startswith('"'):
                value = ast.literal_eval("b" + value).decode()
            elif value.lstrip("-").isdigit():
                value = int(value)
            stack[-1].setdefault(key, []).append(value)
    return root


def one(message, key, default=None):
    return message.get(key, [default])[0]


def replay(trace):
    """Slices by call id (name, start, end, track, args) and flows, as trace_processor would read them."""
    tracks = {}
    sequences = {}
    open_slices = {}
    slices = {}
    flows_out, flows_in = set(), set()
    begins = ends = 0
    for packet in trace.get("packet", []):
        if "track_descriptor" in packet:
            track = packet["track_descriptor"][0]
            tracks[one(track, "uuid")] = (one(track, "name"), one(track, "parent_uuid", 0))
            continue
        sequence_id = one(packet, "trusted_packet_sequence_id")
        if one(packet, "sequence_flags", 0) & 1:
            sequences[sequence_id] = {"names": {}, "args": {}, "strings": {}, "track": None, "clock": None}
        state = sequences.get(sequence_id)
        if "trace_packet_defaults" in packet:
            defaults = packet["trace_packet_defaults"][0]
            check(one(defaults, "timestamp_clock_id") == 64, "events use the sequence's incremental clock")
            state["track"] = one(one(defaults, "track_event_defaults"), "track_uuid")
        for interned in packet.get("interned_data", []):
            for table, key in (("event_names", "names"), ("debug_annotation_names", "args"),
                               ("debug_annotation_string_values", "strings")):
                for entry in interned.get(table, []):
                    state[key][one(entry, "iid")] = one(entry, "name", one(entry, "str"))
        if "clock_snapshot" in packet:
            clocks = {one(c, "clock_id"): c for c in packet["clock_snapshot"][0]["clocks"]}
            check(one(clocks[64], "is_incremental") == "true", "clock 64 is incremental")
            check(one(clocks[64], "timestamp") == one(clocks[6], "timestamp"), "clock 64 is BOOTTIME's")
            state["clock"] = one(clocks[64], "timestamp")
            continue
        if "track_event" not in packet:
            continue
        event = packet["track_event"][0]
        state["clock"] += one(packet, "timestamp", 0)
        track = one(event, "track_uuid", state["track"])
        if one(event, "type") == "TYPE_SLICE_BEGIN":
            begins += 1
            args = {}
            for annotation in event.get("debug_annotations", []):
                name = state["args"][one(annotation, "name_iid")]
                if "string_value_iid" in annotation:
                    args[name] = state["strings"][one(annotation, "string_value_iid")]
                else:
                    args[name] = one(annotation, "uint_value", one(annotation, "int_value"))
            for flow in event.get("flow_ids", []):
                flows_out.add((flow, args["id"]))
            for flow in event.get("terminating_flow_ids", []):
                flows_in.add((flow, args["id"]))
            open_slices.setdefault(track, []).append((state["names"][one(event, "name_iid")], state["clock"], args))
        elif one(event, "type") == "TYPE_SLICE_END":
            ends += 1
            name, start, args = open_slices[track].pop()
            check(state["clock"] >= start, f"call {args['id']} ends before it starts")
            check(args["id"] not in slices, f"call {args['id']} is one slice")
            slices[args["id"]] = (name, start, state["clock"], track, args)
    check(all(not stack for stack in open_slices.values()), "every slice ends")
    return tracks, slices, flows_out, flows_in, begins, ends


def nanoseconds(micros):
    return round(micros * 1000)


def compare(label, work, gradscope, protoc, proto, trace):
    perfetto = os.path.join(work, label + ".pftrace")
    chrome = os.path.join(work, label + ".json")
    must([gradscope, "export", trace, "--format", "perfetto", "-o", perfetto, "-f"])
    must([gradscope, "export", trace, "--format", "chrome-trace", "-o", chrome, "-f"])
    with open(perfetto, "rb") as f:
        raw = f.read()
    packets = inflate_bundles(raw)
    decoded = run([protoc, "--decode=gradscope.perfetto.Trace", "--proto_path=" + os.path.dirname(proto), proto],
                  input=packets)
    if not check(decoded.returncode == 0, f"{label}: protoc decodes the packets: {decoded.stderr.decode()}"):
        return
    tracks, slices, flows_out, flows_in, begins, ends = replay(parse_text_format(decoded.stdout.decode()))

    with open(chrome) as f:
        reference = json.load(f)
    epoch = reference["otherData"]["epoch_ns"]
    processes = {e["pid"]: e["args"]["name"] for e in reference["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in reference["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    calls = [e for e in reference["traceEvents"] if e["ph"] == "X"]
    check(len(calls) > 0, f"{label}: the Chrome trace has calls")
    check(begins == len(calls) and ends == len(calls),
          f"{label}: {begins} begins and {ends} ends for {len(calls)} calls")
    for call in calls:
        call_id = call["args"]["id"]
        if not check(call_id in slices, f"{label}: call {call_id} is a slice"):
            continue
        name, start, end, track, args = slices[call_id]
        check(name == call["name"], f"{label}: call {call_id} is named {name}, not {call['name']}")
        check(start - epoch == nanoseconds(call["ts"]), f"{label}: call {call_id} starts at {start - epoch}")
        check(end - start == nanoseconds(call["dur"]), f"{label}: call {call_id} lasts {end - start}")
        check(args == call["args"], f"{label}: call {call_id} has arguments {args}, not {call['args']}")
        lane, rank_uuid = tracks[track]
        rank, host_uuid = tracks[rank_uuid]
        host, _ = tracks[host_uuid]
        check(lane.startswith(threads[(call["pid"], call["tid"])]), f"{label}: call {call_id} is on {lane}")
        check(f"{rank} ({host[len('host '):]})" == processes[call["pid"]],
              f"{label}: call {call_id} is on {rank} of {host}, not {processes[call['pid']]}")
    chrome_out = {(e["id"], next(c["args"]["id"] for c in calls if c["pid"] == e["pid"] and c["tid"] == e["tid"]
                                 and nanoseconds(c["ts"]) <= nanoseconds(e["ts"]) <= nanoseconds(c["ts"] + c["dur"])))
                  for e in reference["traceEvents"] if e["ph"] == "s"}
    chrome_in = {(e["id"], next(c["args"]["id"] for c in calls if c["pid"] == e["pid"] and c["tid"] == e["tid"]
                                and nanoseconds(c["ts"]) <= nanoseconds(e["ts"]) <= nanoseconds(c["ts"] + c["dur"])))
                 for e in reference["traceEvents"] if e["ph"] == "f"}
    check(flows_out == chrome_out, f"{label}: flows start at the sends ({len(flows_out)} vs {len(chrome_out)})")
    check(flows_in == chrome_in, f"{label}: flows end at the receives ({len(flows_in)} vs {len(chrome_in)})")
    size_ratio = os.path.getsize(chrome) / len(raw)
    print(f"{label}: {len(calls)} calls, {len(flows_out)} flows, {len(raw)} bytes "
          f"({size_ratio:.1f}x smaller than the Chrome trace)")


def refused(gradscope, args, output, label):
    directory = os.path.dirname(output)
    before = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
    result = run([gradscope] + args)
    err = result.stderr.decode()
    check(result.returncode == 2, f"{label}: exit {result.returncode}, not 2")
    check(err.count("\n") == 1 and err.startswith("gradscope: "), f"{label}: one line, not {err!r}")
    check(not os.path.exists(output), f"{label}: {output} was written")
    after = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
    check(before == after, f"{label}: the directory changed: {before} -> {after}")
    print(f"{label}: {err.strip()}")


def main():
    parser = argparse.ArgumentParser()
    for option in ("--gradscope", "--synth", "--protoc", "--proto", "--work"):
        parser.add_argument(option, required=True)
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    ranks = os.path.join(work, "ranks")
    must([args.synth, "--ranks", "4", "--steps", "3", "--gpu", "-o", ranks])
    ddp = os.path.join(work, "ddp.db")
    must([args.gradscope, "merge", ranks, "-o", ddp])
    compare("ddp", work, args.gradscope, args.protoc, args.proto, ddp)
    pipeline = os.path.join(work, "pipeline.db")
    must([args.synth, "--pipeline", pipeline, "--stages", "3", "--replicas", "2", "--steps", "2"])
    compare("pipeline", work, args.gradscope, args.protoc, args.proto, pipeline)

    # Without -o the file is the trace's name with .pftrace.
    job = os.path.join(work, "job.db")
    shutil.copyfile(ddp, job)
    result = must([args.gradscope, "export", job, "--format", "perfetto"])
    check(result.stderr.decode() == f"wrote {job[:-3]}.pftrace\n", f"default output: {result.stderr.decode()!r}")
    with open(job[:-3] + ".pftrace", "rb") as f, open(os.path.join(work, "ddp.pftrace"), "rb") as g:
        check(f.read() == g.read(), "the default output holds the same trace")

    # Standard output carries the same bytes as the file.
    result = must([args.gradscope, "export", ddp, "--format", "perfetto", "-o", "-"])
    with open(os.path.join(work, "ddp.pftrace"), "rb") as f:
        check(result.stdout == f.read(), "'-o -' writes the file's bytes")

    # A full disk behind standard output.
    with open("/dev/full", "wb") as full:
        result = subprocess.run([args.gradscope, "export", ddp, "--format", "perfetto", "-o", "-"], stdout=full,
                                stderr=subprocess.PIPE)
    check(result.returncode == 2 and result.stderr.decode().count("\n") == 1,
          f"a full disk: exit {result.returncode}, {result.stderr.decode()!r}")

    # Refusals: one line, exit 2, nothing written.
    missing_dir = os.path.join(work, "no-such-dir", "out.pftrace")
    refused(args.gradscope, ["export", ddp, "--format", "perfetto", "-o", missing_dir], missing_dir,
            "output in a missing directory")
    under_a_file = os.path.join(ddp, "out.pftrace")
    refused(args.gradscope, ["export", ddp, "--format", "perfetto", "-o", under_a_file], under_a_file,
            "output under a file")
    read_only = os.path.join(work, "read-only")
    os.makedirs(read_only)
    os.chmod(read_only, 0o500)
    if os.geteuid() != 0:  # root writes anywhere
        refused(args.gradscope, ["export", ddp, "--format", "perfetto", "-o", os.path.join(read_only, "t.pftrace")],
                os.path.join(read_only, "t.pftrace"), "unwritable directory")
    empty = os.path.join(work, "empty.db")
    open(empty, "w").close()
    refused(args.gradscope, ["export", empty, "--format", "perfetto", "-o", empty + ".pftrace"],
            empty + ".pftrace", "empty file")
    no_calls_ranks = os.path.join(work, "no-calls")
    must([args.synth, "--ranks", "2", "--steps", "0", "-o", no_calls_ranks])
    no_calls = os.path.join(work, "no-calls.db")
    must([args.gradscope, "merge", no_calls_ranks, "-o", no_calls])
    refused(args.gradscope, ["export", no_calls, "--format", "perfetto", "-o", no_calls + ".pftrace"],
            no_calls + ".pftrace", "trace without calls")
    result = run([args.gradscope, "export", no_calls, "--format", "perfetto", "-o", "-"])
    check(result.returncode == 2 and not result.stdout, "a trace without calls writes nothing to standard output")

    if failures:
        print(f"check_perfetto_export: {len(failures)} failures", file=sys.stderr)
        return 1
    print("check_perfetto_export: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
