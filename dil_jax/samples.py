"""A few hand-written questions and passages for smoke runs that need no data files."""

SAMPLE_QUESTIONS = (
    "What is the capital of France?",
    "Who wrote Pride and Prejudice?",
    "How many blocks does BERT-base have?",
    "When did the first person walk on the Moon?",
)

SAMPLE_PASSAGES = (
    "Paris is the capital and most populous city of France. It sits on the Seine river in the "
    "north of the country and has been a centre of finance, diplomacy and the arts since the "
    "seventeenth century.",
    "Pride and Prejudice is an 1813 novel of manners written by Jane Austen. It follows Elizabeth "
    "Bennet as she deals with matters of upbringing, marriage and moral rectitude.",
    "BERT-base stacks twelve transformer blocks with a hidden size of 768 and twelve attention "
    "heads, while BERT-large has twenty-four blocks and a hidden size of 1024.",
    "Apollo 11 landed on the Moon on 20 July 1969. Neil Armstrong became the first person to step "
    "onto the lunar surface, followed by Buzz Aldrin about twenty minutes later.",
    "The Great Barrier Reef off the coast of Queensland is the largest coral reef system in the "
    "world, made of nearly three thousand individual reefs.",
    "Photosynthesis converts light energy into chemical energy: plants take in carbon dioxide and "
    "water and release oxygen, storing energy in sugars.",
)
