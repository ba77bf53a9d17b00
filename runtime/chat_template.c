/* chat_template.c — tokenizer_config.json's Jinja chat template rendered
 * for moec_chat_render (a stub until the interpreter lands). */
#include "err.h"
#include "runtime/tokenizer.h"

moec_status moec_chat_render(const moec_tokenizer_t *tok, const moec_chat_message_t *msgs, int n_msgs,
                             const moec_chat_options_t *opts, char **out)
{
    (void)tok;
    (void)msgs;
    (void)n_msgs;
    (void)opts;
    if (out)
        *out = NULL;
    return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "chat templates are not implemented yet");
}
