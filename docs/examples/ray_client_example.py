"""A Python job that uses a running ninfer engine actor directly (no HTTP).

Start a server whose actor other jobs can find, then run this from any machine of the cluster:

    ninfer serve build/demo.ninfer --ray-address auto --detached       # or: ray start --head; ninfer serve ...
    python docs/examples/ray_client_example.py --address auto

It streams one chat completion, then runs a token-id request to the end and prints the engine's stats.
"""

from __future__ import annotations

import argparse
import sys

from ninfer.actors import DEFAULT_ACTOR_NAME, Finish, connect


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    p.add_argument("--actor-name", default=DEFAULT_ACTOR_NAME)
    p.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args(argv)

    client = connect(a.actor_name, address=a.address)
    print("model:", client.info().model_id)

    pieces = 0
    for ev in client.stream_chat(
        [{"role": "user", "content": "Say hello."}], max_tokens=a.max_tokens, temperature=0.0
    ):
        print(ev.text, end="", flush=True)  # text that became final since the previous item
        pieces += 1
        if isinstance(ev, Finish):  # the last event (its text: the held-back tail), with the usage
            u = ev.usage
            print(
                f"\n[finish: {ev.reason}, prompt {u.prompt_tokens}, cached {u.cached_tokens}, "
                f"completion {u.completion_tokens}, {pieces} stream items]"
            )

    result = client.generate([1, 2, 3, 4], max_tokens=4, temperature=0.0)
    print("token ids:", result.token_ids, "finish:", result.finish_reason)
    st = client.stats()
    print(f"lanes {st.lanes_busy}/{st.lanes_total}, queue {st.queue_len}/{st.queue_depth}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
