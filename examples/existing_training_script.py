"""Use placer inside an existing training script.

This was a plain PyTorch script: load data, normalise it, train a classifier,
evaluate it, save the model. Its functions are unchanged (each already took a
``device``). The marked block declares them as stages, asks placer where each
should run (``best_placement``: all-CPU at once on a machine without a GPU, else a
short profile and a plan), and runs them there; the rest of the script uses the
results as before.

    python examples/existing_training_script.py [--rows N] [--epochs E] [--placement all=cpu] [--save model.pt]
"""

import argparse

import torch
import torch.nn.functional as F


def load_data(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 20, generator=g)
    y = (x[:, :5].sum(1) + 0.3 * torch.randn(rows, generator=g) > 0).long()
    return {"x": x * 3.0 + 1.0, "y": y}


def normalise(data, device):
    x = data["x"]
    return {"x": (x - x.mean(0)) / x.std(0), "y": data["y"]}


def train(data, device, epochs=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)).to(data["x"].device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        for s in range(0, len(data["x"]), 256):
            loss = F.cross_entropy(model(data["x"][s : s + 256]), data["y"][s : s + 256])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def evaluate(data, model, device):
    with torch.no_grad():
        return (model(data["x"]).argmax(1) == data["y"]).float().mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--placement", default=None, help="e.g. all=cpu or train=gpu (default: placer's plan)")
    ap.add_argument("--save", default=None, help="where to save the trained model's weights")
    args = ap.parse_args()

    # --- placer: the script's functions as stages, placed and run -----------------------
    from placer import Pipeline, execute
    from placer.advisor import best_placement

    p = Pipeline("existing-script", size=args.rows)
    p.add(name="data", cpu=lambda rows: load_data(rows), pin="cpu", params={"rows": args.rows})
    p.add(name="normalise", kind="preprocessing", fn=normalise, inputs={"data": "data"})
    p.add(name="train", kind="training", fn=train, inputs={"data": "normalise"}, params={"epochs": args.epochs})
    p.add(name="evaluate", kind="inference", fn=evaluate, inputs={"data": "normalise", "model": "train"})
    placement, why = (args.placement, "given on the command line") if args.placement else best_placement(p)
    run = execute(p, placement)
    # -------------------------------------------------------------------------------------

    print(f"placement: {why}")
    for s in run.stages:
        print(f"  {s.name:<10} on {s.device:<8} {s.seconds * 1e3:8.1f} ms")
    accuracy = float(run.final_outputs["evaluate"])
    print(f"accuracy {accuracy:.3f} in {run.makespan_s:.2f} s")
    if args.save:
        torch.save(run.outputs["train"].to("cpu").state_dict(), args.save)
        print(f"saved {args.save}")


if __name__ == "__main__":
    main()
