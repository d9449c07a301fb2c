"""What every stage works with: the endpoint, the run's options, fresh prompt numbers, and
one way to send a request (with the key's salt where asked, counted on the progress bar)."""

from __future__ import annotations

from gateway.tools.cachetest.client import Endpoint, Outcome, TargetError, key_salt
from gateway.tools.cachetest.plan import Plan, RunConfig
from gateway.tools.cachetest.progress import Progress
from gateway.tools.cachetest.prompts import PromptMaker


class Context:
    """One run's shared state; stages take prompt numbers from it so none is used twice."""

    def __init__(
        self, endpoint: Endpoint, config: RunConfig, progress: Progress, *, block_size: int
    ) -> None:
        self.endpoint = endpoint
        self.config = config
        self.progress = progress
        self.block_size = block_size
        self.prompts = PromptMaker(config.seed)
        self.sent: list[Outcome] = []  # the first key's, for the summary and the bill
        self._next = 0
        self._answered = False

    @property
    def plan(self) -> Plan:
        """The run's test plan."""
        return self.config.plan

    def fresh(self) -> int:
        """A prompt number no request of this run has used."""
        self._next += 1
        return self._next

    def text(self, number: int | None = None) -> str:
        """A long prompt of the plan's length (a fresh one unless ``number`` is given)."""
        return self.prompts.text(self.fresh() if number is None else number, self.plan.prompt_words)

    async def send(self, text: str, *, second: bool = False) -> Outcome:
        """One request with the first key (or the second), counted on the progress bar."""
        config = self.config
        key = config.key
        if second:
            if config.second_key is None:
                raise ValueError("no second key")
            key = config.second_key
        salt = key_salt(key) if config.salt_per_key else None
        outcome = await self.endpoint.chat(key, text, salt=salt)
        if not self._answered:
            if not outcome.ok:
                raise TargetError(
                    f"the first request to {self.endpoint.target} failed "
                    f"(status {outcome.status}): {outcome.error}"
                )
            self._answered = True
        if not second:
            self.sent.append(outcome)
        self.progress.advance()
        return outcome
