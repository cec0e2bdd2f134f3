"""What ``python cli.py --help`` prints: answered before torch and Lightning are imported (a new user's first command
takes under a second, not the ten a LightningCLI parser needs), so this module imports nothing."""

USAGE = """\
usage: python cli.py {fit,validate,test,predict} --config <yaml> [--<key>=<value> ...] [--verbose]

Train, evaluate and use every family of the zoo (GPT, diffusion, CLIP, CNN, RL agents) from one YAML config;
every run is tracked in MLflow.

subcommands:
  fit        train:  python cli.py fit --config configs/cnn/convnet_mnist.yaml
  validate   evaluate a model on the validation split
  test       evaluate a model on the test split
  predict    answers on new inputs, written into the run's folder and logged

options (each subcommand):
  -c, --config <yaml>      a config: configs/{gpt,diffusion,clip,cnn,rl}/*.yaml, or your own
  --<key>=<value>          any value of the config, e.g. --trainer.max_epochs=3 --model.init_args.optimizer.lr=1e-3
  --ckpt_path <where>      the model to evaluate or use (or the run to resume): a checkpoint file, or a model in
                           MLflow: models:/<name>/<version>, models:/<name>@<alias>, runs:/<run_id>/model
  --trainer.logger.init_args.registered_model_name=<name>
                           fit: register the trained model in MLflow under <name> (then --ckpt_path models:/<name>/1)
  --print_config           print the resolved config and exit
  --verbose                on an error, the full traceback as well as its one error: line

  python cli.py <subcommand> --help     every option of a subcommand: model, data and trainer (loads torch,
                                        Lightning and the families: several seconds)
"""

# Under each subcommand's full option list.
EPILOG = (
    "--ckpt_path takes a checkpoint file or an MLflow model: models:/<name>/<version>, models:/<name>@<alias> or "
    "runs:/<run_id>/model. --verbose shows the full traceback of an error as well as its one error: line."
)
