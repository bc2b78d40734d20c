"""Instructions the target answers to make its own training text, and held-out ones.

Training prompts combine many topics with many kinds of request, so the text covers
explanations, lists, stories, code and dialogue. ``HELD_OUT_PROMPTS`` share no topic with
them: acceptance is measured on those.
"""

from __future__ import annotations

from octavo.plugin_api import CHAT_INSTRUCTIONS as INSTRUCTIONS

TOPICS = (
    "photosynthesis", "the French Revolution", "black holes", "compound interest",
    "the water cycle", "machine learning", "volcanoes", "the human immune system",
    "climate change", "the Roman Empire", "electric cars", "honey bees", "the stock market",
    "vaccines", "plate tectonics", "the internet", "coffee", "the Moon landing",
    "renewable energy", "sleep", "chess", "the printing press", "rainforests",
    "quantum computing", "healthy eating", "jazz music", "the Great Wall of China",
    "recycling", "earthquakes", "public speaking", "bread baking", "time management",
    "the solar system", "ancient Egypt", "cybersecurity", "gardening", "marathon training",
    "the history of writing", "ocean tides", "learning a new language",
)

TASKS = (
    "Explain {topic} to a curious ten-year-old.",
    "Write a short paragraph about {topic}.",
    "List five interesting facts about {topic}.",
    "What are the main advantages and disadvantages of {topic}?",
    "Write a short story in which {topic} plays an important role.",
    "Give me three questions a teacher could ask about {topic}, with answers.",
    "Summarise the most important ideas about {topic} in simple words.",
)

# More topics and kinds of request, after the first set (``training_prompts`` lists them
# after it): the heads learn the target's way of writing, not its text about one topic, so
# more topics teach them more than more replies to the same prompts.
MORE_TOPICS = (
    "the human heart", "dinosaurs", "the Olympic Games", "photography",
    "the Industrial Revolution", "volunteering", "satellites", "mountain climbing", "the piano",
    "friendship", "solar panels", "the Amazon River", "banking", "ancient Greece", "origami",
    "deserts", "evolution", "video games", "coral reefs", "first aid", "the human brain",
    "electricity", "pirates", "the Renaissance", "tea", "wolves", "robots", "trains",
    "the Arctic", "budgeting", "yoga", "the Silk Road", "microscopes", "penguins",
    "social media", "cooking pasta", "magnets", "castles", "football", "mushrooms",
)

MORE_TASKS = (
    "Tell me about {topic}.",
    "Write a short poem about {topic}.",
    "Why is {topic} important?",
    "Write a friendly letter to a friend about {topic}.",
    "What should a beginner know about {topic}?",
)

CODE_PROMPTS = (
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that counts the words in a sentence.",
    "Write a Python function that returns the largest element of a list.",
    "Write a Python function that computes the factorial of n.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python function that removes duplicates from a list.",
    "Write a Python function that converts Celsius to Fahrenheit.",
)

# The benchmark's chat instructions: `octavo bench latency --dataset-name chat` times the
# heads on the same text their acceptance is measured on.
HELD_OUT_PROMPTS = INSTRUCTIONS


def training_prompts() -> list[str]:
    """The first set (every topic x task combination plus the code prompts), then the new
    topics with every task, then the first topics with the new tasks. Each part is ordered
    so that any prefix of it (``--prompts N``) covers many topics and kinds of request:
    round ``r`` gives each topic a different task, and in the first part a code prompt comes
    every fifth place early on."""
    prompts: list[str] = []
    code = list(CODE_PROMPTS)
    for i, prompt in enumerate(_rounds(TOPICS, TASKS)):
        if i % 4 == 3 and code:
            prompts.append(code.pop(0))
        prompts.append(prompt)
    return prompts + _rounds(MORE_TOPICS, TASKS + MORE_TASKS) + _rounds(TOPICS, MORE_TASKS)


def _rounds(topics: tuple[str, ...], tasks: tuple[str, ...]) -> list[str]:
    return [tasks[(t + r) % len(tasks)].format(topic=topic)
            for r in range(len(tasks)) for t, topic in enumerate(topics)]
