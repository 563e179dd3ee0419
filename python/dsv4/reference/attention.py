"""placeholder"""
def sparse_mla_decode_op(*a): raise NotImplementedError
def sparse_mla_prefill_op(*a): raise NotImplementedError
