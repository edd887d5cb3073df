"""Small GPT-2, Llama, BERT and T5 configurations for transformers' own ModelTesterMixin.

Copied by tests/ecosystem/hf_model_tests.py into a tree made from the transformers sdist
(as tests/models/tpu/test_models_tpu.py), so the relative imports below resolve to that
sdist's tests/test_modeling_common.py. The PyPI sdist ships the common mixins but not
tests/models/*, so each model's tester (its tiny config and inputs) is written here; every
test body that runs is transformers' own.
"""

import unittest

from transformers import (
    BertConfig,
    GPT2Config,
    LlamaConfig,
    T5Config,
    is_torch_available,
)
from transformers.testing_utils import require_torch, torch_device

from ...generation.test_utils import GenerationTesterMixin
from ...test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask

if is_torch_available():
    import torch
    from transformers import (
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertLMHeadModel,
        BertModel,
        GPT2ForQuestionAnswering,
        GPT2ForSequenceClassification,
        GPT2ForTokenClassification,
        GPT2LMHeadModel,
        GPT2Model,
        LlamaForCausalLM,
        LlamaForQuestionAnswering,
        LlamaForSequenceClassification,
        LlamaForTokenClassification,
        LlamaModel,
        T5EncoderModel,
        T5ForConditionalGeneration,
        T5ForQuestionAnswering,
        T5ForTokenClassification,
        T5Model,
    )


class _Tester:
    """The attributes ModelTesterMixin reads, for a batch of 2 sequences of 7 tokens."""

    batch_size = 2
    seq_length = 7
    is_training = True
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    num_choices = 4
    # BERT's and T5's question-answering heads are Linear(hidden, num_labels): start and end.
    num_labels = 2
    pad_token_id = 0

    def __init__(self, parent):
        self.parent = parent

    def inputs(self, token_types=False):
        # Pad id 0 never appears, so sequence classification sees one real last token.
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1) + 1
        inputs = {
            "input_ids": input_ids,
            "attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
        }
        if token_types:
            inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], 2)
        return inputs

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self.inputs()


class GPT2Tester(_Tester):
    def get_config(self):
        return GPT2Config(
            vocab_size=self.vocab_size,
            n_embd=self.hidden_size,
            n_layer=self.num_hidden_layers,
            n_head=self.num_attention_heads,
            n_positions=64,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.vocab_size - 1,
            eos_token_id=self.vocab_size - 1,
        )

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self.inputs(token_types=True)


class LlamaTester(_Tester):
    def get_config(self):
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=37,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=2,
            max_position_embeddings=64,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            bos_token_id=1,
            eos_token_id=2,
        )


class BertTester(_Tester):
    def get_config(self):
        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=37,
            max_position_embeddings=64,
            type_vocab_size=2,
            num_labels=self.num_labels,
            num_choices=self.num_choices,
            pad_token_id=self.pad_token_id,
            is_decoder=False,
        )

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self.inputs(token_types=True)


class T5Tester(_Tester):
    eos_token_id = 1
    encoder_seq_length = _Tester.seq_length
    decoder_seq_length = _Tester.seq_length

    def get_config(self):
        return T5Config(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            d_kv=self.hidden_size // self.num_attention_heads,
            d_ff=37,
            num_layers=self.num_hidden_layers,
            num_decoder_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            relative_attention_num_buckets=8,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.pad_token_id,
        )

    def prepare_config_and_inputs_for_common(self):
        inputs = self.inputs()
        # each row ends with one EOS, as T5's tokenizer writes it
        inputs["input_ids"] = inputs["input_ids"].clamp(min=2)
        inputs["input_ids"][:, -1] = self.eos_token_id
        inputs["attention_mask"][:, -1] = 1
        decoder = self.inputs()
        inputs["decoder_input_ids"] = decoder["input_ids"]
        inputs["decoder_attention_mask"] = decoder["attention_mask"]
        return self.get_config(), inputs


class T5EncoderTester(T5Tester):
    # T5EncoderModel has no loss, so ModelTesterMixin's training tests do not apply.
    is_training = False

    def prepare_config_and_inputs_for_common(self):
        config, inputs = super().prepare_config_and_inputs_for_common()
        config.is_encoder_decoder = False
        return config, {
            "input_ids": inputs["input_ids"],
            "attention_mask": inputs["attention_mask"],
        }


class OnTpu:
    """Each suite's tester (tiny config and inputs) comes from its `tester` class."""

    tester = None

    def setUp(self):
        self.model_tester = self.tester(self)


@require_torch
class GPT2ModelTest(OnTpu, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    tester = GPT2Tester
    all_model_classes = (
        GPT2Model,
        GPT2LMHeadModel,
        GPT2ForSequenceClassification,
        GPT2ForTokenClassification,
        GPT2ForQuestionAnswering,
    )


@require_torch
class LlamaModelTest(OnTpu, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    tester = LlamaTester
    all_model_classes = (
        LlamaModel,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
        LlamaForQuestionAnswering,
        LlamaForTokenClassification,
    )


@require_torch
class BertModelTest(OnTpu, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    tester = BertTester
    all_model_classes = (
        BertModel,
        BertLMHeadModel,
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels)
        if return_labels and model_class is BertForPreTraining:
            # the pretraining loss needs both its targets: masked tokens and next sentence
            t = self.model_tester
            inputs["labels"] = torch.zeros(
                (t.batch_size, t.seq_length), dtype=torch.long, device=torch_device
            )
            inputs["next_sentence_label"] = torch.zeros(
                t.batch_size, dtype=torch.long, device=torch_device
            )
        return inputs


@require_torch
class T5ModelTest(OnTpu, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    tester = T5Tester
    is_encoder_decoder = True
    all_model_classes = (
        T5Model,
        T5ForConditionalGeneration,
        T5ForQuestionAnswering,
    )


@require_torch
class T5EncoderOnlyModelTest(OnTpu, ModelTesterMixin, unittest.TestCase):
    tester = T5EncoderTester
    # T5ForTokenClassification runs T5's encoder only, like T5EncoderModel.
    all_model_classes = (T5EncoderModel, T5ForTokenClassification)
