"""verl's interaction YAML: names, duplicates, errors naming the file, selection by interaction_kwargs."""

import pytest

from rljax.agents import BaseInteraction, load_interaction_config, select_interaction

INTERACTION_FILE = '''
from rljax.agents import BaseInteraction


class Gsm8kInteraction(BaseInteraction):
  pass


class Half:
  def __init__(self, config):
    self.config = config

  def start_interaction(self, instance_id=None, **kwargs):
    return instance_id
'''


def write(tmp_path, body):
  (tmp_path / "my_interactions.py").write_text(INTERACTION_FILE)
  path = tmp_path / "interaction.yaml"
  path.write_text(body)
  return str(path)


def test_load_names_and_config(tmp_path):
  path = write(tmp_path, (
      "interaction:\n"
      "  - class_name: my_interactions.py:Gsm8kInteraction\n    config: {k: 1}\n"
      "  - name: other\n    class_name: rljax.agents.interactions.BaseInteraction\n"))
  interactions = load_interaction_config(path)
  assert list(interactions) == ["gsm8k", "other"]
  assert interactions["gsm8k"].config == {"k": 1, "name": "gsm8k"} and interactions["gsm8k"].name == "gsm8k"
  assert select_interaction(interactions, {"name": "other"}) is interactions["other"]
  with pytest.raises(KeyError, match="has no name; the interactions are: gsm8k, other"):
    select_interaction(interactions, {})
  only = {"gsm8k": interactions["gsm8k"]}
  assert select_interaction(only, None) is only["gsm8k"]


def test_base_interaction_defaults():
  base = BaseInteraction({})
  assert base.name == "interaction_agent" and base.start_interaction("i") == "i"
  assert base.generate_response("i", [])[0] is False and base.calculate_score("i") == 0.0


def test_errors_name_the_file(tmp_path):
  path = write(tmp_path, "interaction:\n  - class_name: my_interactions.py:Gsm8kInteraction\n"
                         "  - name: gsm8k\n    class_name: my_interactions.py:Gsm8kInteraction\n")
  with pytest.raises(ValueError, match=r"interaction.yaml: interaction\[1\] is named 'gsm8k', like an earlier"):
    load_interaction_config(path)
  path = write(tmp_path, "interaction:\n  - class_name: my_interactions.py:Half\n")
  with pytest.raises(TypeError, match=r"interaction.yaml: interaction\[0\]\.class_name='my_interactions.py:Half' "
                                      r"lacks method\(s\) generate_response, calculate_score, finalize_interaction"):
    load_interaction_config(path)
  path = write(tmp_path, "interaction:\n  - class_name: my_interactions.py:Nope\n")
  with pytest.raises(ImportError, match=r"interaction.yaml: interaction\[0\]\.class_name='my_interactions.py:Nope'"):
    load_interaction_config(path)
