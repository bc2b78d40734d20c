"""``octavo proxy``: an OpenAI-compatible front over prefill and decode instances."""

from __future__ import annotations

import logging

import click

from octavo.entrypoints.proxy.pool import POLICIES


@click.command()
@click.option("--prefill", "prefill_urls", multiple=True, required=True, metavar="URL",
              help="A prefill instance (octavo serve with a producer KV connector); repeat "
                   "for several.")
@click.option("--decode", "decode_urls", multiple=True, required=True, metavar="URL",
              help="A decode instance (octavo serve with a consumer KV connector); repeat "
                   "for several.")
@click.option("--policy", type=click.Choice(POLICIES), default="round_robin",
              show_default=True, help="How to choose among the instances of a kind.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on.")
@click.option("--probe-interval", type=float, default=1.0, show_default=True,
              help="Seconds between health probes of instances out of rotation.")
def proxy(prefill_urls: tuple[str, ...], decode_urls: tuple[str, ...], policy: str,
          host: str, port: int, probe_interval: float) -> None:
    """Disaggregated serving: prompts on prefill instances, generation on decode instances.

    Each request goes to a prefill instance with max_tokens=1, then to a decode instance,
    whose answer (streamed or not) is passed through. Instances that fail leave the rotation
    until their /health answers again; /status shows them and the proxy's counters.
    """
    import uvicorn

    from octavo.entrypoints.proxy.app import Proxy, build_app
    from octavo.entrypoints.proxy.pool import InstancePool

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: "
                        "%(message)s", datefmt="%H:%M:%S")
    app = build_app(Proxy(InstancePool("prefill", list(prefill_urls), policy),
                          InstancePool("decode", list(decode_urls), policy),
                          probe_interval=probe_interval))
    uvicorn.run(app, host=host, port=port, log_level="warning")
