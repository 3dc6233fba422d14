"""The serving room: the policy behind the endpoints the ecosystem speaks, every sampled token recorded per episode.

It calls engines (`p3o.rollout`); engines know nothing of HTTP. Needs the ``serve`` extra (``pip install
'p3o[serve]'``: FastAPI, uvicorn, renderers; the ``openai`` SDK for harnesses).

The Python API (stable; `p3o serve` is the command):

    from p3o.serve import EndpointServer
    server = EndpointServer(engine, tokenizer, model_name="tiny-agent", api_key=None, host="127.0.0.1", port=0,
                            max_model_len=None, tool_format="auto").start()
    server.url                          # http://127.0.0.1:<port>
    server.api_key                      # generated per server unless given; write_info(path) puts it in a 0600 file
    server.episode_url("ep-1")          # an OpenAI base_url for one episode: <url>/episodes/ep-1/v1
    server.load_weights(state_dict, version=1)   # between engine calls; later tokens carry version 1
    rows = server.store.pop("ep-1")     # list[p3o.serve.episodes.Row]: prompt_ids, ids, mask, logprobs, versions,
                                        # kept, reason ("start" | "rewrite" | "fork" | "branch"), calls, stats
    server.counters()                   # requests, ok, unauthorized, bad_request, overlong, unknown_tool_format,
                                        # wrong_model, server_errors, tool_calls, tool_parse_errors, unrecorded,
                                        # split_rewrite, split_fork, rows, engine_calls, batched_jobs, sampled_tokens
    server.batcher.gather(expect=lambda: running_episodes, max_wait_s=0.25)   # share engine calls across episodes
    server.write_info(run_dir / "endpoint.json")  # url, base_url, api_key, model, max_model_len (mode 0600)
    server.stop()

Routes and fields: `p3o.serve.app`; episode rules (prefix matching, splits): `p3o.serve.episodes`; tool-call formats:
`p3o.serve.tools`; batching: `p3o.serve.batcher`.
"""

from p3o.lazy import lazy_exports

__all__ = ["Choice", "EndpointServer", "EpisodeStore", "Row"]

__getattr__ = lazy_exports(
    __name__,
    {"p3o.serve.server": ("EndpointServer",), "p3o.serve.episodes": ("Choice", "EpisodeStore", "Row")},
)
