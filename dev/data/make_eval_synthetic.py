"""Writes a synthetic evaluation file shaped like the HellaSwag validation set, for timing --eval.

Each line is {"ind": i, "ctx": ..., "endings": [4 strings], "label": 0..3}: contexts of 20 to 90
and endings of 8 to 40 random common English words, labels uniform. The text means nothing, so
the accuracy on it is chance (25%); only the shape and the token counts are realistic.
    python dev/data/make_eval_synthetic.py build/eval_synthetic.jsonl --examples 10042 --seed 0
Standard library only.
"""
import argparse
import json
import random

WORDS = """
the a an and or but if then so because while after before when where who what which that this
these those there here it he she they we you I his her their our your my its one two three four
five man woman child boy girl dog cat bird car bus train house room door window table chair bed
kitchen garden street park shop school office city river lake sea sky sun rain snow wind tree
flower grass road bridge hill field friend family mother father brother sister teacher doctor
worker player team game ball book letter phone computer picture song water food bread coffee tea
milk apple box bag hat coat shoe hand head face eye arm leg foot hair voice time day night morning
evening week year moment minute hour is was are were has had does did will can could should would
goes went comes came takes took makes made sees saw looks looked walks walked runs ran sits sat
stands stood opens opened closes closed holds held puts put gives gave finds found tells told asks
asked turns turned starts started stops stopped tries tried pulls pulled pushes pushed carries
carried throws threw catches caught cuts cut washes washed cleans cleaned cooks cooked eats ate
drinks drank reads read writes wrote plays played sings sang smiles smiled laughs laughed waves
waved nods nodded big small long short old new young good bad hot cold warm wet dry fast slow
quiet loud happy sad tired busy empty full clean dirty bright dark red blue green white black
yellow in on at to from with without into onto over under behind between near around through
across along up down out off away back again still just very quite really slowly quickly carefully
together finally suddenly then now soon always never often
""".split()


def sentence(rng, low, high):
    """Between low and high random words, capitalized, ending in a period."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
    return text[0].upper() + text[1:] + "."


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the .jsonl file to write")
    parser.add_argument("--examples", type=int, default=10042, help="how many examples (default: 10042, as the real set)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.output, "w", encoding="utf-8") as f:
        for ind in range(args.examples):
            example = {
                "ind": ind,
                "ctx": sentence(rng, 20, 90),
                "endings": [sentence(rng, 8, 40) for _ in range(4)],
                "label": rng.randrange(4),
            }
            f.write(json.dumps(example) + "\n")


if __name__ == "__main__":
    main()
