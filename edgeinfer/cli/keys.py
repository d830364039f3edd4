"""``edgeinfer keys``: the fleet's Ed25519 signing key."""

from __future__ import annotations

from pathlib import Path

import click

from .output import handle_errors, print_json

DEFAULT_KEY_DIR = Path("fleet-data")


@click.group()
def keys() -> None:
    """Manage the key that signs model rollouts."""


@keys.command("init")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_KEY_DIR,
              show_default=True, help="Where the key pair is written (the fleet manager's data dir).")
@click.option("--force", is_flag=True, help="Replace an existing key (every agent must re-pin the new one).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def keys_init(directory: Path, force: bool, as_json: bool) -> None:
    """Create an Ed25519 signing key; print the public key agents pin in their config."""
    from ..updates.signing import SigningKey

    key = SigningKey.generate()
    private_path, public_path = key.save(directory, overwrite=force)
    public = key.public_key_b64()
    if as_json:
        print_json({"private_key": str(private_path), "public_key_file": str(public_path), "public_key": public})
        return
    click.echo(f"private key: {private_path} (mode 0600 — keep it on the fleet manager only)")
    click.echo(f"public key:  {public_path}")
    click.echo("pin it in each agent's config:")
    click.echo(f"  update_public_key: {public}")


@keys.command("show")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_KEY_DIR,
              show_default=True)
@handle_errors
def keys_show(directory: Path) -> None:
    """Print the public key of the fleet's signing key."""
    from ..updates.signing import PRIVATE_KEY_FILE, SigningKey

    click.echo(SigningKey.load(directory / PRIVATE_KEY_FILE).public_key_b64())
