"""The synthetic world: scenes, questions, prompts, masks and the standard sample set."""
