"""``--resume`` in a multi-process run: every rank resumes from the same checkpoint, or none starts.

What a work dir is across nodes: rank 0 alone writes into the work dir (log, checkpoints,
metrics), on the node it runs on; every rank reads the checkpoint it resumes from (and the
files a ``LoadCheckpoint`` names) at the same path on its own node. With a work dir on a file
system every node mounts at the same path, every rank finds rank 0's checkpoints. With each
node's own local disk, the other nodes' work dirs hold no checkpoint.

So each rank looks for its checkpoint as a single process does (:func:`~hat_ignite.cli.resume.find_resume`),
then the ranks compare what they found (one all-gather of a short text per rank, before
anything is built on it or written): the step, and the content hash the checkpoint records.
If any rank found another checkpoint, none, or a file it cannot load, every rank raises the same
:class:`~hat_ignite.cli.common.CliError`, naming each node that differs from rank 0 (its rank(s),
host and what it found) and the two fixes: a shared work dir, or a copy of rank 0's checkpoint at
the same path on that node. Without this, the ranks would train from different steps, mixing
their gradients, or wait for each other in a collective until ``--dist-timeout``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any, Optional, Sequence, cast

from hat_ignite.cli.common import CliError

__all__ = ["agree_on_resume", "as_rank_0_finds", "describe_found", "disagreement"]


def describe_found(found: Optional[tuple[str, Mapping[str, Any]]], error: Optional[BaseException],
                   searched: Sequence[str]) -> dict[str, Any]:
    """What this rank would resume from, as plain values (what the ranks compare).

    >>> describe_found(("/w/c.pth.tar", {"content_sha256": "ab" * 32, "progress": {"iteration": 4}}), None, [])
    {'path': '/w/c.pth.tar', 'sha256': 'abababababababababababababababababababababababababababababababab', 'steps': 4}
    >>> describe_found(None, None, ["/w/checkpoints"])
    {'path': None, 'searched': ['/w/checkpoints']}
    """
    if error is not None:
        return {"path": None, "error": str(error)}
    if found is None:
        return {"path": None, "searched": list(searched)}
    path, checkpoint = found
    progress = checkpoint.get("progress")
    steps = progress.get("iteration") if isinstance(progress, Mapping) else None
    sha = checkpoint.get("content_sha256")
    return {"path": path, "sha256": sha if isinstance(sha, str) else None, "steps": steps}


def _what(found: Mapping[str, Any]) -> str:
    if found.get("error"):
        return f"cannot use its checkpoint: {found['error']}"
    if found.get("path") is None:
        return f"found no checkpoint in {', '.join(found.get('searched') or ['its work dir'])}"
    steps = found.get("steps")
    done = f", {steps} steps done" if steps is not None else ""
    sha = found.get("sha256")
    return f"would resume from {found['path']}{done}{f', content {sha[:8]}' if sha else ''}"


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get("error") or b.get("error"):
        return False
    if a.get("path") is None or b.get("path") is None:
        return a.get("path") is None and b.get("path") is None
    if a.get("sha256") and b.get("sha256"):
        return a["sha256"] == b["sha256"] and a.get("steps") == b.get("steps")
    return os.path.normpath(a["path"]) == os.path.normpath(b["path"]) and a.get("steps") == b.get("steps")


def disagreement(everyone: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """Why the ranks cannot resume together, or ``None`` when all found what rank 0 found.

    ``everyone[r]`` is rank ``r``'s :func:`describe_found` plus its ``node`` and ``host``.

    >>> a = {"node": 0, "host": "n0", "path": "/w/c.pth.tar", "sha256": "ab" * 32, "steps": 4}
    >>> disagreement([a, dict(a, node=1, host="n1")]) is None
    True
    >>> text = disagreement([a, {"node": 1, "host": "n1", "path": None, "searched": ["/w/checkpoints"]}])
    >>> print(text)  # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
    --resume: the ranks of this job would not resume from the same checkpoint, so none starts (nothing was
    trained or written). Rank 0 (node 0, host n0) would resume from /w/c.pth.tar, 4 steps done, content
    abababab; node 1 (host n1, rank 1) found no checkpoint in /w/checkpoints. ... copy /w/c.pth.tar to the
    same path on node 1 (host n1)..., then resume again.
    """
    reference = everyone[0]
    nodes: dict[int, list[int]] = {}
    for rank, found in enumerate(everyone):
        if not _same(found, reference):
            nodes.setdefault(int(found.get("node", rank)), []).append(rank)
    if not nodes:
        return None
    lines = [f"Rank 0 (node {reference.get('node')}, host {reference.get('host')}) {_what(reference)}"]
    for node, ranks in sorted(nodes.items()):
        first = everyone[ranks[0]]
        which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        lines.append(f"node {node} (host {first.get('host')}, {which}) {_what(first)}")
    missing = ", ".join(f"node {n} (host {everyone[r[0]].get('host')})" for n, r in sorted(nodes.items()))
    if reference.get("path"):
        copy = f"copy {reference['path']} to the same path on {missing}"
    else:
        copy = f"remove or move the checkpoints of {missing} that rank 0 does not have"
    return (
        "--resume: the ranks of this job would not resume from the same checkpoint, so none starts (nothing was "
        f"trained or written). {'; '.join(lines)}. Only rank 0 writes into the work dir, on its own node, and "
        "every rank reads the checkpoint it resumes from at the same path on its node (docs/distributed.md, "
        "'Work dirs across nodes'). Give every node the same work dir on a file system they all mount at the "
        f"same path, or {copy}, then resume again."
    )


def agree_on_resume(found: Optional[tuple[str, Mapping[str, Any]]], error: Optional[BaseException],
                    searched: Sequence[str]) -> Optional[tuple[str, Mapping[str, Any]]]:
    """Return ``found`` once every rank of the job found the same checkpoint (or none).

    One process: ``error`` is raised as it is. Several: the ranks exchange what they found;
    every rank returns, or every rank raises the same :class:`CliError` (see :func:`disagreement`).
    """
    import ignite.distributed as idist

    if idist.get_world_size() <= 1:
        if error is not None:
            raise error
        return found
    mine = dict(describe_found(found, error, searched), node=idist.get_node_rank(), host=socket.gethostname())
    gathered = idist.all_gather(json.dumps(mine, ensure_ascii=True))  # one string per rank
    everyone = [json.loads(str(text)) for text in cast(list, gathered)]
    problem = disagreement(everyone)
    if problem:
        raise CliError(problem)
    return found


def as_rank_0_finds(reason: Optional[str]) -> Optional[str]:
    """Rank 0's answer on every rank (one broadcast in a multi-process run).

    Whether the run is already finished is read from ``metrics.json``, which only rank 0's work
    dir holds; the ranks must decide alike, or those that train would wait for those that left.
    """
    import ignite.distributed as idist

    if idist.get_world_size() <= 1:
        return reason
    return str(idist.broadcast(reason or "", src=0)) or None
