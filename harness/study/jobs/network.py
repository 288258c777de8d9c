"""The collective library's network plugin in a study: set together with its library, or not at all.

A site profile's `network_plugin` (harness.study.sites.NetworkPlugin) names the libfabric plugin NCCL
or RCCL needs on Slingshot (aws-ofi-nccl on Polaris and Perlmutter, aws-ofi-rccl on Frontier), the
directories it lives in and the variables that select it. NCCL_NET naming a network whose plugin is
not loaded fails every communicator at init, one-node runs included, so the job and `--check` look
for the library before any run and stop with one line naming the fix.

The study setting NCCL_NET_PLUGIN turns it off: `NCCL_NET_PLUGIN=off` unsets the plugin's variables
and NCCL_NET, as ALCF advises where the plugin makes some DeepSpeed jobs hang (NCCL then falls back
to its TCP sockets: slower across nodes, and the records say so in their environment).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from ...errors import UsageError
from ..sites import SiteProfile, expand_path

PLUGIN_SETTING = "NCCL_NET_PLUGIN"
PLUGIN_CHOICES = ("on", "off")


def plugin_choice(value: str) -> str:
    """NCCL_NET_PLUGIN's value, checked: on (default) or off."""
    value = value.strip().lower() or "on"
    if value not in PLUGIN_CHOICES:
        raise UsageError(
            f"{PLUGIN_SETTING}={value}: choose on (the site's libfabric plugin) or off (NCCL's sockets, "
            "as ALCF advises where the plugin hangs DeepSpeed)"
        )
    return value


def _directories(profile: SiteProfile, environ: Mapping[str, str]) -> list[str]:
    """The plugin's own directories (expanded), then LD_LIBRARY_PATH's, each once."""
    plugin = profile.network_plugin
    own = [expand_path(path, environ) for path in (plugin.library_path if plugin else ())]
    return list(dict.fromkeys(d for d in [*own, *environ.get("LD_LIBRARY_PATH", "").split(":")] if d))


def apply_network_plugin(profile: SiteProfile, choice: str, environ: MutableMapping[str, str]) -> None:
    """Put the plugin's directories first on LD_LIBRARY_PATH and set its variables where the job has
    not (`choice` on), or
    unset its variables and NCCL_NET (`choice` off); nothing where the site names no plugin."""
    plugin = profile.network_plugin
    if plugin is None:
        return
    if choice == "off":
        for name in (*plugin.variables, "NCCL_NET"):
            environ.pop(name, None)
        return
    environ["LD_LIBRARY_PATH"] = ":".join(_directories(profile, environ))
    for name, value in plugin.variables.items():  # a value the job already has is the user's tuning: kept
        environ.setdefault(name, value)


def check_network_plugin(profile: SiteProfile, choice: str, gpus: int, environ: Mapping[str, str]) -> list[str]:
    """One line naming the fix when GPU runs would need the plugin and its library is in none of the
    directories NCCL/RCCL will search; [] otherwise."""
    plugin = profile.network_plugin
    if plugin is None or choice == "off" or not gpus:
        return []
    directories = _directories(profile, environ)
    if any(os.path.isfile(os.path.join(directory, plugin.library)) for directory in directories):
        return []
    where = ", ".join(directories) if directories else "an empty LD_LIBRARY_PATH"
    return [
        f"{profile.name}'s network plugin {plugin.library} is in none of {where}: {plugin.fix}; or pass "
        f"{PLUGIN_SETTING}=off to run without it (NCCL's TCP sockets)"
    ]
