"""A scheduler that writes a request's first output tokens from a script in its prompt, so
that tests of how the front end reads replies (reasoning, tool calls) know the text a
random tiny model produced. Plugged into a real engine by its qualified name
(``--scheduler-cls tests.e2e.scripted_scheduler.ScriptedScheduler``).

The script is the tokens between the prompt's first two ``<|pad|>`` tokens (the tiny
tokenizer's, id 258): while the request has fewer outputs than the script has tokens, the
token the model sampled is replaced by the script's next one - before the scheduler appends
it, so stop checks and guided decoding's grammar see the scripted token. After the script
the model samples on its own (under the request's constraint, if it has one).
"""

from __future__ import annotations

from dataclasses import replace

from octavo.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.sched.scheduler import Scheduler

MARK = 258  # <|pad|>


def script_of(prompt_token_ids: list[int]) -> list[int]:
    marks = [index for index, token in enumerate(prompt_token_ids) if token == MARK][:2]
    return prompt_token_ids[marks[0] + 1:marks[1]] if len(marks) == 2 else []


class ScriptedScheduler(Scheduler):
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        sampled = []
        for request_id, tokens in zip(model_runner_output.req_ids,
                                      model_runner_output.sampled_token_ids):
            request = self.requests.get(request_id)
            script = script_of(request.prompt_token_ids) if request is not None else []
            if tokens and request is not None and request.num_output_tokens < len(script):
                tokens = [script[request.num_output_tokens]]
            sampled.append(tokens)
        return super().update_from_output(
            scheduler_output, replace(model_runner_output, sampled_token_ids=sampled))
