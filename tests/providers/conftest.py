"""Provider tests: the emulator on loopback and one litellm loaded for the whole session."""

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.upstream.providers import Providers
from tests.providers.emulator import Emulator, start


@pytest.fixture(scope="session")
def providers() -> Iterator[Providers]:
    loaded = Providers()
    loaded.load()
    yield loaded


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[Emulator, str]]:
    fake = Emulator()
    runner, url = await start(fake)
    yield fake, url
    await runner.cleanup()
