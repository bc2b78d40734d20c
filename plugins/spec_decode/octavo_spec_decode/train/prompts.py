"""Instructions the target answers to make its own training text, and held-out ones.

Training prompts combine many topics with many kinds of request, so the text covers
explanations, lists, stories, code and dialogue. ``HELD_OUT_PROMPTS`` share no topic with
them: acceptance is measured on those.
"""

from __future__ import annotations

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

HELD_OUT_PROMPTS = (
    "Describe how a bicycle works.",
    "What should I pack for a week-long camping trip?",
    "Explain the difference between weather and climate.",
    "Write a short poem about autumn leaves.",
    "How do airplanes stay in the air?",
    "Give me some tips for writing a good resume.",
    "Write a Python function that computes the Fibonacci numbers up to n.",
    "Why is the sky blue?",
    "Tell me about the life cycle of a butterfly.",
    "How can I improve my memory?",
    "Explain what a database index is.",
    "Write a friendly email inviting a colleague to lunch.",
)


def training_prompts() -> list[str]:
    """Every topic x task combination plus the code prompts, ordered so that any prefix of
    the list (``--prompts N``) covers many topics and kinds of request: round ``r`` gives
    each topic a different task, and a code prompt comes every fifth place early on."""
    rounds = [TASKS[(t + r) % len(TASKS)].format(topic=topic)
              for r in range(len(TASKS)) for t, topic in enumerate(TOPICS)]
    prompts: list[str] = []
    code = list(CODE_PROMPTS)
    for i, prompt in enumerate(rounds):
        if i % 4 == 3 and code:
            prompts.append(code.pop(0))
        prompts.append(prompt)
    return prompts
