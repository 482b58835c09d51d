"""A callback base written the way HAT's is: every one of the 13 hooks a no-op taking ``**kwargs``,
no ``attach``. Tests subclass it as HAT users subclass HAT's ``CallbackMixin``."""


class HatStyleBase:
    """HAT's callback base, as HAT users subclass it: every hook a no-op."""

    def on_loop_begin(self, **kwargs):
        pass

    def on_loop_end(self, **kwargs):
        pass

    def on_epoch_begin(self, **kwargs):
        pass

    def on_epoch_end(self, **kwargs):
        pass

    def on_step_begin(self, **kwargs):
        pass

    def on_step_end(self, **kwargs):
        pass

    def on_batch_begin(self, **kwargs):
        pass

    def on_batch_end(self, **kwargs):
        pass

    def on_backward_begin(self, **kwargs):
        pass

    def on_backward_end(self, **kwargs):
        pass

    def on_optimizer_step_begin(self, **kwargs):
        pass

    def on_forward_begin(self, **kwargs):
        pass

    def on_forward_end(self, **kwargs):
        pass
