"""The request loop by which each decode baseline (decode_llama_cpp.py,
decode_torch.py) answers the bench's generate and precision stages, so that its
decode steps and sneppx's alternate in the same rounds and a slow phase of the
host lands on every side.

A session fills a cache and runs steps over it:
    session.prepare(context, batch)  a cache of `batch` rows of `context` tokens
                                     each (untimed), and one warm-up step
    session.step()                   one decode step at that context, every row
                                     one new token, then the cache cut back to
                                     the context: the next step sees the same
                                     one; returns the seconds the step took
Requests, one line each, each answered with one line:
    context C B   -> ready C B
    step          -> done <seconds>  (the bench times the whole request)
    ping          -> pong
    quit, or the end of the input, ends the loop; anything else, a step before
    any context, or a session that fails -> error <why>
"""


def serve(session, stdin, stdout):
    def say(text):
        print(text, file=stdout, flush=True)

    prepared = False
    for line in stdin:
        words = line.split()
        if not words:
            continue
        if words == ["quit"]:
            break
        if words == ["ping"]:
            say("pong")
        elif words[0] == "context" and len(words) == 3:
            try:
                context, batch = int(words[1]), int(words[2])
            except ValueError:
                context = batch = 0
            if context < 1 or batch < 1:
                say(f"error context and batch must be positive integers: {line.strip()!r}")
                continue
            prepared = False
            try:
                session.prepare(context, batch)
            except Exception as error:  # noqa: BLE001 -- the bench reads why, the server goes on
                say(f"error {type(error).__name__}: {error}")
                continue
            prepared = True
            say(f"ready {context} {batch}")
        elif words == ["step"]:
            if not prepared:
                say("error no context: ask `context C B` first")
                continue
            try:
                say(f"done {session.step():.6f}")
            except Exception as error:  # noqa: BLE001
                say(f"error {type(error).__name__}: {error}")
        else:
            say(f"error unknown request {line.strip()!r}")
